package e2b

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
)

// A sandbox's access token authenticates the calls to its sandbox URL
// (envd and the code interpreter), which E2B's SDKs send without the API
// key. sandgate hands it out for every sandbox, secure or not, at create
// and connect (envdAccessToken, and trafficAccessToken, which the code
// interpreter's context calls carry instead): no sandbox URL call is
// unauthenticated. It is an HMAC of the tenant, the sandbox id and a
// random nonce of the sandbox (kept in its record: a sandbox created
// again under the same id would get another token) under a key of its
// own, derived from the gateway's: it names that one sandbox of that one
// tenant, lives as long as the sandbox, and is not kept anywhere.

// tokenPrefix starts every access token.
const tokenPrefix = "e2bt_"

// tokenLabel derives the access tokens' key from the gateway's.
const tokenLabel = "e2b-access-token"

// unknownTenant stands for the tenant of a sandbox id nobody owns: its
// token is computed all the same, so that an unknown id takes as long to
// refuse as a known one.
const unknownTenant = "\x00unknown"

// newTokenNonce is a sandbox's token nonce.
func newTokenNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// token is the access token of tenant's sandbox id whose record has
// nonce.
func (a *api) token(tenant, id, nonce string) string {
	k := hmac.New(sha256.New, a.d.Key)
	k.Write([]byte(tokenLabel))
	m := hmac.New(sha256.New, k.Sum(nil))
	m.Write([]byte(tenant + "\x00" + id + "\x00" + nonce))
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sessionToken is s's access token.
func (a *api) sessionToken(s *gateway.Session) string {
	rec, _ := e2bmeta.Of(s)
	return a.token(s.Tenant, s.ID, rec.TokenNonce)
}

// accessToken is the sandbox URL's Credential (rest.Mount): the principal
// of a request whose X-Access-Token (or E2B-Traffic-Access-Token) is the
// token of the sandbox its E2b-Sandbox-Id names, or false (the request is
// then authenticated by its API key, if any).
func (a *api) accessToken(r *http.Request) (gateway.Principal, bool) {
	id := r.Header.Get("E2b-Sandbox-Id")
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		tok = r.Header.Get("E2B-Traffic-Access-Token")
	}
	if id == "" || !strings.HasPrefix(tok, tokenPrefix) || len(tok) > 128 {
		return gateway.Principal{}, false
	}
	tenant, known := a.d.Sessions.Owner(id)
	nonce := ""
	if known {
		s, err := a.d.Sessions.Get(r.Context(), gateway.Principal{Tenant: tenant}, id)
		if err == nil {
			rec, _ := e2bmeta.Of(s)
			nonce = rec.TokenNonce
		}
	} else {
		tenant = unknownTenant
	}
	if !hmac.Equal([]byte(tok), []byte(a.token(tenant, id, nonce))) || !known {
		return gateway.Principal{}, false
	}
	return gateway.Principal{Tenant: tenant, Method: "e2b_access_token"}, true
}
