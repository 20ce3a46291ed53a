package rest_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/gateway"
)

const (
	testIssuer   = "https://issuer.test"
	testAudience = "sandgate"
)

var (
	rsaKey = sync.OnceValue(func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	})
	otherRSAKey = sync.OnceValue(func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	})
	edKey = sync.OnceValue(func() ed25519.PrivateKey {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
)

func sign(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claims returns valid claims for sub; each override replaces a claim, and
// a nil value removes it.
func claims(sub string, override ...any) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": sub, "iss": testIssuer, "aud": testAudience,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}
	for i := 0; i+1 < len(override); i += 2 {
		k := override[i].(string)
		if override[i+1] == nil {
			delete(c, k)
		} else {
			c[k] = override[i+1]
		}
	}
	return c
}

func rsaPublicPEM(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&rsaKey().PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// TestBadTokens sends tokens that must not verify to gateways configured in
// each way; every one must answer 401 with WWW-Authenticate: Bearer, create
// nothing and leave no trace of the token in the logs.
func TestBadTokens(t *testing.T) {
	rsaPEM := rsaPublicPEM(t)
	past := time.Now().Add(-time.Hour).Unix()
	future := time.Now().Add(time.Hour).Unix()
	unsigned := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Common bad tokens, for every configuration.
	common := func(t *testing.T) map[string]string {
		return map[string]string{
			"garbage":             "not-a-token",
			"three dots":          "a.b.c",
			"api key other case":  strings.ToUpper(aliceKey),
			"api key with suffix": aliceKey + "x",
			"api key prefix":      aliceKey[:len(aliceKey)-1],
			"alg none":            unsigned(claims("alice")),
			"alg none no sig dot": strings.TrimSuffix(unsigned(claims("alice")), "."),
			"HS256 wrong secret":  sign(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef012345"), claims("alice")),
			"RS256 other key":     sign(t, jwt.SigningMethodRS256, otherRSAKey(), claims("alice")),
			"HS256 with RSA PEM":  sign(t, jwt.SigningMethodHS256, rsaPEM, claims("alice")),
			"HS512 with secret":   sign(t, jwt.SigningMethodHS512, []byte(jwtSecret), claims("alice")),
			"over 8192 bytes":     strings.Repeat("x", gateway.MaxTokenLen+1),
		}
	}
	configs := []struct {
		name  string
		auth  gateway.AuthConfig
		extra func(t *testing.T) map[string]string
	}{
		{
			name: "HS256",
			auth: gateway.AuthConfig{APIKeys: map[string]string{aliceKey: "alice"}, JWTSecret: []byte(jwtSecret), JWTIssuer: testIssuer, JWTAudience: testAudience},
			extra: func(t *testing.T) map[string]string {
				hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), c) }
				return map[string]string{
					"expired":        hs(claims("alice", "exp", past)),
					"no exp":         hs(claims("alice", "exp", nil)),
					"wrong audience": hs(claims("alice", "aud", "someone-else")),
					"no audience":    hs(claims("alice", "aud", nil)),
					"wrong issuer":   hs(claims("alice", "iss", "https://evil.test")),
					"no issuer":      hs(claims("alice", "iss", nil)),
					"no sub":         hs(claims("alice", "sub", nil)),
					"empty sub":      hs(claims("")),
					"not yet valid":  hs(claims("alice", "nbf", future)),
					"exp as string":  hs(claims("alice", "exp", "tomorrow")),
					"huge valid jwt": hs(claims(strings.Repeat("a", gateway.MaxTokenLen))),
					"RS256 real key": sign(t, jwt.SigningMethodRS256, rsaKey(), claims("alice")),
				}
			},
		},
		{
			name: "RS256 public key only",
			auth: gateway.AuthConfig{JWTPublicKey: &rsaKey().PublicKey, JWTIssuer: testIssuer, JWTAudience: testAudience},
			extra: func(t *testing.T) map[string]string {
				rs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, rsaKey(), c) }
				return map[string]string{
					"expired":              rs(claims("alice", "exp", past)),
					"no exp":               rs(claims("alice", "exp", nil)),
					"wrong audience":       rs(claims("alice", "aud", []string{"a", "b"})),
					"wrong issuer":         rs(claims("alice", "iss", "https://evil.test")),
					"HS256 with DER":       sign(t, jwt.SigningMethodHS256, mustDER(t), claims("alice")),
					"HS256 with jwtSecret": sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), claims("alice")),
					"PS256 real key":       sign(t, jwt.SigningMethodPS256, rsaKey(), claims("alice")),
					"RS512 real key":       sign(t, jwt.SigningMethodRS512, rsaKey(), claims("alice")),
					"api key":              aliceKey,
				}
			},
		},
		{
			name: "RS256 and HS256",
			auth: gateway.AuthConfig{JWTSecret: []byte(jwtSecret), JWTPublicKey: &rsaKey().PublicKey},
			extra: func(t *testing.T) map[string]string {
				return map[string]string{
					"expired RS256": sign(t, jwt.SigningMethodRS256, rsaKey(), claims("alice", "exp", past)),
					"no exp HS256":  sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), claims("alice", "exp", nil)),
				}
			},
		},
		{
			name: "EdDSA",
			auth: gateway.AuthConfig{JWTPublicKey: edKey().Public(), JWTAudience: testAudience},
			extra: func(t *testing.T) map[string]string {
				_, other, _ := ed25519.GenerateKey(rand.Reader)
				ed := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodEdDSA, edKey(), c) }
				return map[string]string{
					"other key":      sign(t, jwt.SigningMethodEdDSA, other, claims("alice")),
					"expired":        ed(claims("alice", "exp", past)),
					"no exp":         ed(claims("alice", "exp", nil)),
					"wrong audience": ed(claims("alice", "aud", "x")),
					"HS256 with key": sign(t, jwt.SigningMethodHS256, []byte(edKey().Public().(ed25519.PublicKey)), claims("alice")),
				}
			},
		},
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			auth := cfg.auth
			g := newGateway(t, gwOptions{auth: &auth})
			tokens := common(t)
			for k, v := range cfg.extra(t) {
				tokens[k] = v
			}
			headers := map[string][]string{
				"no header":      nil,
				"empty bearer":   {"Authorization", "Bearer "},
				"bearer only":    {"Authorization", "Bearer"},
				"basic scheme":   {"Authorization", "Basic " + aliceKey},
				"key without it": {"Authorization", aliceKey},
			}
			for name, tok := range tokens {
				headers[name] = []string{"Authorization", "Bearer " + tok}
			}
			for name, hdr := range headers {
				t.Run(name, func(t *testing.T) {
					for _, m := range []struct{ method, path string }{
						{http.MethodPost, "/v1/sessions"},
						{http.MethodGet, "/v1/sessions"},
						{http.MethodGet, "/v1/host-keys"},
					} {
						r := g.do(t, m.method, m.path, "", nil, hdr...)
						expect(t, r, http.StatusUnauthorized, "unauthorized")
						if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
							t.Errorf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
						}
					}
					connHdr := hdr
					if len(hdr) == 2 {
						connHdr = []string{"Proxy-Authorization", hdr[1]}
					}
					r, _, _ := g.rawConnect(t, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa", connHdr...)
					expect(t, r, http.StatusUnauthorized, "unauthorized")
				})
			}
			if n := g.sandboxDirs(t); n != 0 {
				t.Errorf("bad tokens created %d sandboxes", n)
			}
			if _, total := g.mgr.List(context.Background(), gateway.Principal{Tenant: "alice"}, 100, 0); total != 0 {
				t.Errorf("bad tokens created %d sessions for alice", total)
			}
			logs := g.logs.String()
			for name, tok := range tokens {
				if len(tok) > 8 && strings.Contains(logs, tok) {
					t.Errorf("token %q appears in the logs", name)
				}
			}
		})
	}
}

func mustDER(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&rsaKey().PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestValidJWTs checks that good tokens of every algorithm verify and that
// the tenant is the token's sub behind the prefix "jwt:", so that a JWT
// with sub alice is not the API key's tenant alice.
func TestValidJWTs(t *testing.T) {
	cases := []struct {
		name  string
		auth  gateway.AuthConfig
		token func(t *testing.T, c jwt.MapClaims) string
	}{
		{"HS256", gateway.AuthConfig{JWTSecret: []byte(jwtSecret), JWTIssuer: testIssuer, JWTAudience: testAudience},
			func(t *testing.T, c jwt.MapClaims) string {
				return sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), c)
			}},
		{"RS256", gateway.AuthConfig{JWTPublicKey: &rsaKey().PublicKey, JWTIssuer: testIssuer, JWTAudience: testAudience},
			func(t *testing.T, c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, rsaKey(), c) }},
		{"EdDSA", gateway.AuthConfig{JWTPublicKey: edKey().Public(), JWTIssuer: testIssuer, JWTAudience: testAudience},
			func(t *testing.T, c jwt.MapClaims) string { return sign(t, jwt.SigningMethodEdDSA, edKey(), c) }},
		{"no iss or aud configured", gateway.AuthConfig{JWTSecret: []byte(jwtSecret)},
			func(t *testing.T, c jwt.MapClaims) string {
				c["iss"], c["aud"] = "anyone", "anything"
				return sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), c)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			auth := c.auth
			auth.APIKeys = map[string]string{aliceKey: "alice"}
			g := newGateway(t, gwOptions{auth: &auth})
			aliceJWT := c.token(t, claims("alice"))
			otherJWT := c.token(t, claims("mallory", "aud", []string{"other", testAudience}))

			s := g.create(t, aliceJWT, `{}`)
			mine := g.create(t, otherJWT, `{}`)
			// The API key of tenant alice does not see the session the JWT
			// with sub alice made (tenant jwt:alice); that JWT does.
			if l := g.list(t, aliceKey); l.Total != 0 {
				t.Errorf("alice's API key lists %+v, want none", l)
			}
			if l := g.list(t, aliceJWT); l.Total != 1 || l.Sessions[0].SessionID != s.SessionID {
				t.Errorf("alice's JWT lists %+v, want only %s", l, s.SessionID)
			}
			expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil), 404, "not_found")
			expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+mine.SessionID, aliceJWT, nil), 404, "not_found")
			expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+mine.SessionID, otherJWT, nil), 200, "")
			expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, aliceJWT, nil), 204, "")
		})
	}
}

// TestJWTTenantMapping: --jwt-tenant-claim and --jwt-tenant-prefix. With
// the prefix set to "" on purpose a JWT sub and an API key share a tenant;
// another claim names the tenant; a token without it is a 401.
func TestJWTTenantMapping(t *testing.T) {
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), c) }
	none := ""
	t.Run("shared on purpose", func(t *testing.T) {
		g := newGateway(t, gwOptions{auth: &gateway.AuthConfig{
			APIKeys: map[string]string{aliceKey: "alice"}, JWTSecret: []byte(jwtSecret), JWTTenantPrefix: &none,
		}})
		s := g.create(t, hs(claims("alice")), `{}`)
		if l := g.list(t, aliceKey); l.Total != 1 || l.Sessions[0].SessionID != s.SessionID {
			t.Errorf("alice's API key lists %+v, want %s", l, s.SessionID)
		}
	})
	t.Run("other claim", func(t *testing.T) {
		g := newGateway(t, gwOptions{auth: &gateway.AuthConfig{
			APIKeys: map[string]string{aliceKey: "jwt:acme"}, JWTSecret: []byte(jwtSecret), JWTTenantClaim: "org",
		}})
		s := g.create(t, hs(claims("someone", "org", "acme")), `{}`)
		if l := g.list(t, aliceKey); l.Total != 1 || l.Sessions[0].SessionID != s.SessionID {
			t.Errorf("tenant jwt:acme lists %+v, want %s", l, s.SessionID)
		}
		for name, tok := range map[string]string{
			"missing":    hs(claims("someone")),
			"empty":      hs(claims("someone", "org", "")),
			"not string": hs(claims("someone", "org", 7)),
		} {
			r := g.do(t, http.MethodPost, "/v1/sessions", tok, nil)
			expect(t, r, http.StatusUnauthorized, "unauthorized")
			if t.Failed() {
				t.Logf("claim %s", name)
			}
		}
	})
}

// TestHugeAuthorizationHeader sends a 1 MB header to a server built like
// serve.go builds it: the answer (431, or 401) must come within a second.
func TestHugeAuthorizationHeader(t *testing.T) {
	g := newGateway(t, gwOptions{})
	for _, size := range []int{1 << 20, 128 << 10} {
		conn, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		start := time.Now()
		_ = conn.SetDeadline(start.Add(5 * time.Second))
		writeDone := make(chan struct{})
		go func() {
			defer close(writeDone)
			req := "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
				strings.Repeat("A", size) + "\r\nContent-Length: 0\r\n\r\n"
			_, _ = io.WriteString(conn, req) // the server may close before it has all of it
		}()
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("%d-byte header: no answer after %v: %v", size, elapsed, err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge && res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%d-byte header: status %d, want 431 or 401", size, res.StatusCode)
		}
		if elapsed >= time.Second {
			t.Errorf("%d-byte header: answered after %v, want < 1s", size, elapsed)
		}
		conn.Close()
		<-writeDone
	}
	// Under the header limit but over the token limit: a normal 401.
	start := time.Now()
	r := g.do(t, http.MethodGet, "/v1/sessions", strings.Repeat("B", 60<<10), nil)
	expect(t, r, http.StatusUnauthorized, "unauthorized")
	if d := time.Since(start); d >= time.Second {
		t.Errorf("60 KiB token answered after %v", d)
	}
	if n := g.sandboxDirs(t); n != 0 {
		t.Errorf("%d sandboxes exist", n)
	}
}
