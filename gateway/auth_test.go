package gateway_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/gateway"
)

const (
	apiKey    = "sg_unit_test_key_0123456789"
	hsSecret  = "unit-test-hs256-secret-0123456789abcdef"
	issuer    = "https://issuer.test"
	audience  = "sandgate"
	subject   = "tenant-42"
	otherSecr = "another-hs256-secret-0123456789abcdef!!"
)

var (
	rsaKey = sync.OnceValue(func() *rsa.PrivateKey {
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

func signed(t testing.TB, m jwt.SigningMethod, key any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// goodClaims returns valid claims; pairs override them, a nil value removes one.
func goodClaims(pairs ...any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": subject, "iss": issuer, "aud": audience, "exp": time.Now().Add(time.Hour).Unix()}
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == nil {
			delete(c, pairs[i].(string))
		} else {
			c[pairs[i].(string)] = pairs[i+1]
		}
	}
	return c
}

func newVerifier(t testing.TB, cfg gateway.AuthConfig) *gateway.Verifier {
	t.Helper()
	v, err := gateway.NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func pkixPEM(t testing.TB, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestNewVerifierRejectsBadConfig(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, cfg := range map[string]gateway.AuthConfig{
		"empty key":        {APIKeys: map[string]string{"": "alice"}},
		"empty tenant":     {APIKeys: map[string]string{"k": ""}},
		"ecdsa key":        {JWTPublicKey: &ec.PublicKey},
		"private key":      {JWTPublicKey: rsaKey()},
		"rsa key by value": {JWTPublicKey: rsaKey().PublicKey},
	} {
		if _, err := gateway.NewVerifier(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestVerify(t *testing.T) {
	past := time.Now().Add(-time.Minute).Unix()
	none := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	full := gateway.AuthConfig{
		APIKeys:   map[string]string{apiKey: "keyed"},
		JWTSecret: []byte(hsSecret), JWTIssuer: issuer, JWTAudience: audience,
	}
	rsaOnly := gateway.AuthConfig{JWTPublicKey: &rsaKey().PublicKey, JWTIssuer: issuer, JWTAudience: audience}
	edOnly := gateway.AuthConfig{JWTPublicKey: edKey().Public()}
	open := gateway.AuthConfig{JWTSecret: []byte(hsSecret)} // no iss/aud configured
	hs := func(c jwt.MapClaims) string { return signed(t, jwt.SigningMethodHS256, []byte(hsSecret), c) }
	rs := func(c jwt.MapClaims) string { return signed(t, jwt.SigningMethodRS256, rsaKey(), c) }

	cases := []struct {
		name   string
		cfg    gateway.AuthConfig
		token  string
		tenant string // "" means it must not verify
		method string
	}{
		{"api key", full, apiKey, "keyed", "api_key"},
		{"HS256", full, hs(goodClaims()), "jwt:" + subject, "jwt"},
		{"HS256 aud list", full, hs(goodClaims("aud", []string{"x", audience})), "jwt:" + subject, "jwt"},
		{"RS256", rsaOnly, rs(goodClaims()), "jwt:" + subject, "jwt"},
		{"EdDSA", edOnly, signed(t, jwt.SigningMethodEdDSA, edKey(), goodClaims()), "jwt:" + subject, "jwt"},
		{"no iss/aud configured, any given", open, hs(goodClaims("iss", "x", "aud", "y")), "jwt:" + subject, "jwt"},
		{"no iss/aud configured, none given", open, hs(goodClaims("iss", nil, "aud", nil)), "jwt:" + subject, "jwt"},

		{"empty", full, "", "", ""},
		{"garbage", full, "garbage", "", ""},
		{"api key with space", full, apiKey + " ", "", ""},
		{"api key upper", full, strings.ToUpper(apiKey), "", ""},
		{"over MaxTokenLen", full, strings.Repeat("a", gateway.MaxTokenLen+1), "", ""},
		{"valid JWT over MaxTokenLen", full, hs(goodClaims("pad", strings.Repeat("p", gateway.MaxTokenLen))), "", ""},
		{"expired", full, hs(goodClaims("exp", past)), "", ""},
		{"no exp", full, hs(goodClaims("exp", nil)), "", ""},
		{"exp not a number", full, hs(goodClaims("exp", "soon")), "", ""},
		// RFC 7519: a NumericDate is a JSON number, never a string of digits.
		{"exp a numeric string", full, hs(goodClaims("exp", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))), "", ""},
		{"nbf a numeric string", full, hs(goodClaims("nbf", strconv.FormatInt(past, 10))), "", ""},
		{"iat a numeric string", full, hs(goodClaims("iat", strconv.FormatInt(past, 10))), "", ""},
		{"exp a fraction", full, hs(goodClaims("exp", float64(time.Now().Add(time.Hour).Unix())+0.5)), "jwt:" + subject, "jwt"},
		{"nbf in the future", full, hs(goodClaims("nbf", time.Now().Add(time.Hour).Unix())), "", ""},
		{"wrong aud", full, hs(goodClaims("aud", "other")), "", ""},
		{"no aud", full, hs(goodClaims("aud", nil)), "", ""},
		{"wrong iss", full, hs(goodClaims("iss", "https://evil.test")), "", ""},
		{"no iss", full, hs(goodClaims("iss", nil)), "", ""},
		{"no sub", full, hs(goodClaims("sub", nil)), "", ""},
		{"empty sub", full, hs(goodClaims("sub", "")), "", ""},
		{"wrong secret", full, signed(t, jwt.SigningMethodHS256, []byte(otherSecr), goodClaims()), "", ""},
		{"HS384 with the secret", full, signed(t, jwt.SigningMethodHS384, []byte(hsSecret), goodClaims()), "", ""},
		{"alg none", full, none(goodClaims()), "", ""},
		{"alg none on RSA config", rsaOnly, none(goodClaims()), "", ""},
		{"RS256 when only HS256 is configured", full, rs(goodClaims()), "", ""},
		{"HS256 with the RSA public key PEM", rsaOnly, signed(t, jwt.SigningMethodHS256, pkixPEM(t, &rsaKey().PublicKey), goodClaims()), "", ""},
		{"HS256 with the RSA public key PEM, secret configured too",
			gateway.AuthConfig{JWTSecret: []byte(hsSecret), JWTPublicKey: &rsaKey().PublicKey},
			signed(t, jwt.SigningMethodHS256, pkixPEM(t, &rsaKey().PublicKey), goodClaims()), "", ""},
		{"HS256 with the Ed25519 key bytes", edOnly, signed(t, jwt.SigningMethodHS256, []byte(edKey().Public().(ed25519.PublicKey)), goodClaims()), "", ""},
		{"PS256 with the RSA key", rsaOnly, signed(t, jwt.SigningMethodPS256, rsaKey(), goodClaims()), "", ""},
		{"RS256 with the secret configured as JWTSecret only", open, rs(goodClaims()), "", ""},
		{"JWT when only API keys are configured", gateway.AuthConfig{APIKeys: map[string]string{apiKey: "k"}}, hs(goodClaims()), "", ""},
		{"signature stripped", full, strings.Join(strings.Split(hs(goodClaims()), ".")[:2], ".") + ".", "", ""},
		{"four segments", full, hs(goodClaims()) + ".x", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := newVerifier(t, c.cfg).Verify(c.token)
			if c.tenant == "" {
				if err == nil || p != (gateway.Principal{}) {
					t.Fatalf("verified as %+v", p)
				}
				if !errors.Is(err, gateway.ErrUnauthorized) {
					t.Errorf("error %v, want ErrUnauthorized", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("did not verify: %v", err)
			}
			if p.Tenant != c.tenant || p.Method != c.method {
				t.Errorf("principal %+v, want tenant %q method %q", p, c.tenant, c.method)
			}
		})
	}
}

func TestParsePublicKeyPEM(t *testing.T) {
	rsaPub := &rsaKey().PublicKey
	edPub := edKey().Public().(ed25519.PublicKey)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jwt"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, edPub, edKey())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want any // nil: an error
	}{
		{"PKIX RSA", pkixPEM(t, rsaPub), rsaPub},
		{"PKCS1 RSA", pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(rsaPub)}), rsaPub},
		{"PKIX Ed25519", pkixPEM(t, edPub), edPub},
		{"certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), edPub},
		{"not PEM", []byte("hello"), nil},
		{"private key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2}}), nil},
		{"broken PKIX", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}), nil},
		{"broken certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := gateway.ParsePublicKeyPEM(c.data)
			if c.want == nil {
				if err == nil {
					t.Errorf("parsed %T", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			type equaler interface{ Equal(crypto.PublicKey) bool }
			if e, ok := got.(equaler); !ok || !e.Equal(c.want) {
				t.Errorf("got %T, want %T", got, c.want)
			}
		})
	}
}

// FuzzVerify: no arbitrary token verifies (the fuzzer cannot forge a
// signature, so only the configured API key may), and none panics.
func FuzzVerify(f *testing.F) {
	rsaPEM := pkixPEM(f, &rsaKey().PublicKey)
	past := time.Now().Add(-time.Hour).Unix()
	for _, s := range []string{
		"", "x", "a.b.c", "..", "....", "Bearer x", apiKey + "x", strings.ToUpper(apiKey),
		"eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ4IiwiZXhwIjo5OTk5OTk5OTk5fQ.",
		"eyJhbGciOiJIUzI1NiJ9.e30.", "eyJhbGciOiJSUzI1NiJ9.e30.AAAA", "eyJ9.eyJ9.eyJ9",
		signed(f, jwt.SigningMethodHS256, []byte(hsSecret), goodClaims("exp", past)),
		signed(f, jwt.SigningMethodHS256, []byte(hsSecret), goodClaims("exp", nil)),
		signed(f, jwt.SigningMethodHS256, []byte(hsSecret), goodClaims("aud", "other")),
		signed(f, jwt.SigningMethodHS256, []byte(otherSecr), goodClaims()),
		signed(f, jwt.SigningMethodHS256, rsaPEM, goodClaims()),
		signed(f, jwt.SigningMethodRS256, rsaKey(), goodClaims("exp", past)),
		signed(f, jwt.SigningMethodEdDSA, edKey(), goodClaims("sub", nil)),
		strings.Repeat("A", gateway.MaxTokenLen+1),
		"\x00.\x00.\x00", "é.é.é",
	} {
		f.Add(s)
	}
	v := newVerifier(f, gateway.AuthConfig{
		APIKeys:   map[string]string{apiKey: "keyed"},
		JWTSecret: []byte(hsSecret), JWTIssuer: issuer, JWTAudience: audience,
	})
	vRSA := newVerifier(f, gateway.AuthConfig{JWTPublicKey: &rsaKey().PublicKey})
	vEd := newVerifier(f, gateway.AuthConfig{JWTPublicKey: edKey().Public()})
	f.Fuzz(func(t *testing.T, token string) {
		for _, v := range []*gateway.Verifier{v, vRSA, vEd} {
			p, err := v.Verify(token)
			if token == apiKey && v != vRSA && v != vEd {
				if err != nil || p.Tenant != "keyed" {
					t.Fatalf("the API key did not verify: %+v %v", p, err)
				}
				continue
			}
			if err == nil || p != (gateway.Principal{}) {
				t.Fatalf("token %q verified as %+v", token, p)
			}
		}
	})
}

// TestJWTTenantMapping: a JWT's tenant is the configured claim (default
// sub) behind a prefix (default "jwt:"), so a JWT with sub "default" is not
// the tenant of the bare API key unless the operator maps them together on
// purpose; a missing, empty or non-string claim does not verify.
func TestJWTTenantMapping(t *testing.T) {
	hs := func(c jwt.MapClaims) string { return signed(t, jwt.SigningMethodHS256, []byte(hsSecret), c) }
	prefix := func(s string) *string { return &s }
	base := gateway.AuthConfig{APIKeys: map[string]string{apiKey: "default"}, JWTSecret: []byte(hsSecret)}
	with := func(claim string, pfx *string) gateway.AuthConfig {
		c := base
		c.JWTTenantClaim, c.JWTTenantPrefix = claim, pfx
		return c
	}
	cases := []struct {
		name   string
		cfg    gateway.AuthConfig
		token  string
		tenant string // "": must not verify
	}{
		{"api key", base, apiKey, "default"},
		{"sub default is not the api key's tenant", base, hs(goodClaims("sub", "default")), "jwt:default"},
		{"prefix off on purpose", with("", prefix("")), hs(goodClaims("sub", "default")), "default"},
		{"own prefix", with("", prefix("idp/")), hs(goodClaims("sub", "default")), "idp/default"},
		{"other claim", with("org", nil), hs(goodClaims("org", "acme")), "jwt:acme"},
		{"other claim missing, sub present", with("org", nil), hs(goodClaims()), ""},
		{"other claim empty", with("org", nil), hs(goodClaims("org", "")), ""},
		{"other claim a number", with("org", nil), hs(goodClaims("org", 42)), ""},
		{"other claim a list", with("org", nil), hs(goodClaims("org", []string{"acme"})), ""},
		{"other claim an object", with("org", nil), hs(goodClaims("org", map[string]any{"id": "acme"})), ""},
		{"other claim null", with("org", nil), hs(goodClaims("org", nil)), ""},
		{"sub a number", base, hs(goodClaims("sub", 7)), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := newVerifier(t, c.cfg).Verify(c.token)
			if c.tenant == "" {
				if !errors.Is(err, gateway.ErrUnauthorized) || p != (gateway.Principal{}) {
					t.Errorf("verified as %+v, %v", p, err)
				}
				return
			}
			if err != nil || p.Tenant != c.tenant {
				t.Errorf("tenant %q (%v), want %q", p.Tenant, err, c.tenant)
			}
		})
	}
}
