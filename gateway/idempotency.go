package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"
)

// Idempotency keys (the IETF httpapi Idempotency-Key draft): a create that
// carries a key the same tenant used before, for a session that still
// exists and was made less than IdempotencyWindow ago, returns that session
// instead of making another. The key is kept in the session's Record, so it
// survives a gateway restart exactly when the session does, and it is
// forgotten with the session: after a delete, an expiry or a create rolled
// back because its answer could not be delivered, the key makes a new
// session.
const (
	// MaxIdempotencyKeyLen bounds an idempotency key, in bytes.
	MaxIdempotencyKeyLen = 255
	// IdempotencyWindow is how long a key is remembered at most.
	IdempotencyWindow = 24 * time.Hour
)

// idemKey names one tenant's idempotency key.
type idemKey struct{ tenant, key string }

// checkIdempotencyKey accepts "" (no key) or 1 to MaxIdempotencyKeyLen
// printable ASCII characters.
func checkIdempotencyKey(key string) error {
	if key == "" {
		return nil
	}
	if len(key) > MaxIdempotencyKeyLen {
		return Invalid("invalid_idempotency_key", fmt.Sprintf("Idempotency-Key is %d bytes; at most %d are allowed", len(key), MaxIdempotencyKeyLen))
	}
	for i := range len(key) {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return Invalid("invalid_idempotency_key", "Idempotency-Key must be printable ASCII")
		}
	}
	return nil
}

// fingerprint identifies a create's payload after defaults are applied, so
// that {} and {"ttl": 3600} are the same request.
// The name and the workspace count only when given, so fingerprints made
// before sessions had them stay the same.
func fingerprint(ttl int, image string, metadata map[string]any, sshKey string, res *Resources, egress []string, secrets []SecretRef, name string, ws WorkspaceRef) [32]byte {
	var wsp *WorkspaceRef
	if ws != (WorkspaceRef{}) {
		wsp = &ws
	}
	data, _ := json.Marshal(struct { // map keys marshal sorted: deterministic
		TTL          int            `json:"ttl"`
		Image        string         `json:"image"`
		Metadata     map[string]any `json:"metadata"`
		SSHPublicKey string         `json:"sshPublicKey"`
		Resources    *Resources     `json:"resources,omitempty"` // nil: the defaults
		Egress       []string       `json:"egress,omitempty"`
		Secrets      []SecretRef    `json:"secrets,omitempty"`
		Name         string         `json:"name,omitempty"`
		Workspace    *WorkspaceRef  `json:"ws,omitempty"`
	}{ttl, image, metadata, sshKey, res, egress, secrets, name, wsp})
	return sha256.Sum256(data)
}

// errKeyReused is the answer to a key used again with another payload.
func errKeyReused() error {
	return &Error{Kind: KindUnprocessable, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used with a different request body; use a new key for a new request"}
}

// errKeyInProgress is the answer to a key whose first request has not finished.
func errKeyInProgress() error {
	return &Error{Kind: KindConflict, Code: "idempotency_key_in_progress",
		Message: "a request with this Idempotency-Key is still in progress; retry later", RetryAfter: time.Second}
}

// replayLocked returns the session that tenant's key made, if it still
// exists and is within the window; m.mu is held.
func (m *Manager) replayLocked(k idemKey, now time.Time) *Session {
	for _, s := range m.sessions {
		if s.Tenant == k.tenant && s.IdempotencyKey == k.key && now.Sub(s.CreatedAt) < IdempotencyWindow {
			return s
		}
	}
	return nil
}
