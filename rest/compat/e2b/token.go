package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/sandgate/sandgate/gateway"
)

// A sandbox's access token authenticates the calls to its sandbox URL
// (envd and the code interpreter), which E2B's SDKs send without the API
// key. sandgate hands it out for every sandbox, secure or not, at create
// and connect (envdAccessToken, and trafficAccessToken, which the code
// interpreter's context calls carry instead): no sandbox URL call is
// unauthenticated. It is an HMAC of the tenant and the sandbox id under
// the gateway's key: it names that one sandbox of that one tenant, lives
// as long as the sandbox, and is not kept anywhere.

// tokenPrefix starts every access token.
const tokenPrefix = "e2bt_"

// token is the access token of tenant's sandbox id.
func (a *api) token(tenant, id string) string {
	m := hmac.New(sha256.New, a.d.Key)
	m.Write([]byte("e2b-access-token\x00" + tenant + "\x00" + id))
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
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
	tenant, ok := a.d.Sessions.Owner(id)
	if !ok {
		return gateway.Principal{}, false
	}
	if !hmac.Equal([]byte(tok), []byte(a.token(tenant, id))) {
		return gateway.Principal{}, false
	}
	return gateway.Principal{Tenant: tenant, Method: "e2b_access_token"}, true
}
