package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestRecordJSONIsTheStoreFormat pins the JSON of Record: the bbolt store
// keeps it, so a renamed field would lose sessions across an upgrade.
func TestRecordJSONIsTheStoreFormat(t *testing.T) {
	cases := []struct {
		name string
		json string
	}{
		{"failed, every field", `{"id":"sbx-a","tenant":"t","image":"default","metadata":{"k":"v"},` +
			`"createdAt":"2025-01-02T03:04:05.000000006Z","expiresAt":"2025-01-02T04:04:05Z",` +
			`"lastActivityAt":"2025-01-02T03:05:00Z","ttl":3600,"sshPublicKey":"ssh-ed25519 AAAA",` +
			`"passwordHash":"AQID","status":"failed","statusReason":"lost",` +
			`"idempotencyKey":"order-1","requestHash":"BAUG"}`},
		{"running, optional fields empty", `{"id":"sbx-b","tenant":"t","image":"default","metadata":{},` +
			`"createdAt":"2025-01-02T03:04:05Z","expiresAt":"2025-01-02T03:05:05Z",` +
			`"lastActivityAt":"2025-01-02T03:04:05Z","ttl":60,"passwordHash":"AQID","status":"running"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Record
			if err := json.Unmarshal([]byte(c.json), &r); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			// Key order is not part of the format; names and values are.
			var a, b map[string]any
			if err := json.Unmarshal(got, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(c.json), &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("round trip:\n got %s\nwant %s", got, c.json)
			}
		})
	}
}

func TestSnapshotRoundTripsThroughRecord(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	r := Record{
		ID: "sbx-a", Tenant: "t",
		View: View{
			Image: "default", Metadata: map[string]any{"k": "v"},
			CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now.Add(time.Minute), TTL: 3600,
			Status: StatusFailed, StatusReason: "lost",
			Egress: &EgressView{Allow: []string{"pypi.org"}, BytesIn: 5, BytesOut: 7}, Secrets: []SecretRef{{Name: "A"}},
		},
		SSHPublicKey: "ssh-ed25519 AAAA", PasswordHash: sha256.New().Sum(nil),
		IdempotencyKey: "order-1", RequestHash: bytes.Repeat([]byte{7}, 32),
		EgressCA: []byte("ca"), EgressCAKey: []byte("key"),
	}
	s := sessionFromRecord(r)
	snap := s.Snapshot()
	a, _ := json.Marshal(r)
	b, _ := json.Marshal(snap)
	if string(a) != string(b) {
		t.Errorf("snapshot of a restored session:\n got %s\nwant %s", b, a)
	}
	snap.PasswordHash[0] ^= 0xff
	if string(s.Snapshot().PasswordHash) != string(r.PasswordHash) {
		t.Error("a change to a snapshot's PasswordHash reached the session")
	}
}
