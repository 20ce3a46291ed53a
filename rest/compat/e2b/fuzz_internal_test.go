package e2b

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// FuzzMetadataFilter: any metadata query is answered (a filter or a 400),
// never a panic; a filter matches the pairs it was given.
func FuzzMetadataFilter(f *testing.F) {
	for _, s := range []string{"", "a=b", "a%3Db", "k=v&k2=v%252", "%zz", "=", "a=b=c&&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		w := httptest.NewRecorder()
		match, ok := metadataFilter(w, raw)
		if !ok {
			if w.Code != http.StatusBadRequest {
				t.Fatalf("%q: refused with %d", raw, w.Code)
			}
			return
		}
		_ = match(map[string]string{"a": "b"})
	})
}

// FuzzCursor: a nextToken is a sandbox id this API handed out, or refused.
func FuzzCursor(f *testing.F) {
	l := listedSandbox{SandboxID: "sbx-abc", StartedAt: time.Unix(0, 1700000000123456789)}
	for _, s := range []string{"", cursorOf(l), "c2J4LWFiYw", "!!", strings.Repeat("A", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		c, ok := parseCursor(tok)
		if ok && tok != "" && c.id == "" {
			t.Fatalf("%q: accepted as no cursor", tok)
		}
		if ok && tok != "" && cursorOf(listedSandbox{SandboxID: c.id, StartedAt: time.Unix(0, c.started)}) != tok {
			t.Fatalf("%q: does not round-trip", tok)
		}
	})
}

// owners is a Sessions that knows one session's owner (accessToken reads
// nothing else).
type owners struct {
	Sessions
	id, tenant string
}

func (o owners) Owner(id string) (string, bool) {
	if id == o.id {
		return o.tenant, true
	}
	return "", false
}

// Get finds no session: the token of a session without a record has no
// nonce.
func (o owners) Get(context.Context, gateway.Principal, string) (*gateway.Session, error) {
	return nil, gateway.ErrNotFound
}

// FuzzAccessToken: only the sandbox's own token authenticates a request
// for it.
func FuzzAccessToken(f *testing.F) {
	a := &api{d: Deps{Key: []byte("k"), Sessions: owners{id: "sbx-1", tenant: "alice"}}}
	good := a.token("alice", "sbx-1", "")
	for _, s := range []string{"", good, good[:len(good)-1], tokenPrefix, a.token("bob", "sbx-1", ""), a.token("alice", "sbx-2", "")} {
		f.Add("sbx-1", s)
	}
	f.Fuzz(func(t *testing.T, id, tok string) {
		r := httptest.NewRequest("GET", "/compat/e2b/sandbox/health", nil)
		r.Header["E2b-Sandbox-Id"] = []string{id}
		r.Header["X-Access-Token"] = []string{tok}
		p, ok := a.accessToken(r)
		if want := id == "sbx-1" && tok == good; ok != want || ok && p != (gateway.Principal{Tenant: "alice", Method: "e2b_access_token"}) {
			t.Fatalf("id %q token %q: %v %+v", id, tok, ok, p)
		}
	})
}

// FuzzStripPrefix: the path the services see is rooted and has no prefix.
func FuzzStripPrefix(f *testing.F) {
	for _, s := range []string{SandboxPrefix, SandboxPrefix + "/", SandboxPrefix + "//execute", SandboxPrefix + "/files"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if !strings.HasPrefix(p, "/") {
			return
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.Path = p
		got := stripPrefix(r, SandboxPrefix).URL.Path
		if !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") {
			t.Fatalf("%q -> %q", p, got)
		}
	})
}
