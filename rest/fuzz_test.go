package rest_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/rest"
)

// FuzzCreateBody posts arbitrary bodies to POST /v1/sessions on the real
// server: never a 5xx (the recoverer turns panics into 500), always an answer
// the spec describes, and a session made from one is deleted again.
func FuzzCreateBody(f *testing.F) {
	seeds := []string{
		``, `{}`, `null`, `[]`, `"x"`, `0`, `{"ttl":60}`, `{"ttl":28800}`, `{"ttl":28801}`,
		`{"ttl":-9223372036854775808}`, `{"ttl":9223372036854775808}`, `{"ttl":1e400}`, `{"ttl":null}`,
		`{"image":"default"}`, `{"image":"\u0000"}`, "{\"image\":\"\xff\xfe\"}", `{"image":"nope"}`,
		`{"metadata":{"a":[1,{"b":null}],"c":"\ud800"}}`, `{"metadata":{}}`, `{"metadata":null}`,
		`{"sshPublicKey":"ssh-rsa AAAA"}`, `{"sshPublicKey":""}`, `{"sshPublicKey":"\n\n"}`,
		`{"ttl":60}{"ttl":61}`, `{"TTL":60}`, `{"ttl":60,"ttl":0}`, "\ufeff{}", `{"x":1}`,
		`{"metadata":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
		`{"metadata":{"x":` + strings.Repeat(`{"y":`, 500) + `1` + strings.Repeat("}", 500) + `}}`,
		`{"metadata":{"x":"` + strings.Repeat("a", rest.MaxBodyBytes) + `"}}`,
		`{` + strings.Repeat(" ", 1000) + `}`, `{"ttl":6e1}`, `{"ttl":60.0}`, `{"ttl":"60"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	g := newGateway(f, gwOptions{})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := g.exchange(t, false, http.MethodPost, "/v1/sessions", aliceKey, body)
		switch r.status {
		case http.StatusCreated:
			id := r.session(t).SessionID
			expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+id, aliceKey, nil), http.StatusNoContent, "")
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if r.errorCode() == "" {
				t.Errorf("%d without an error code: %s", r.status, r.body)
			}
		default:
			t.Errorf("body %.200q: status %d %s", body, r.status, r.body)
		}
	})
}
