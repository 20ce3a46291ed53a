package gateway

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// Principal is an authenticated caller. Tenant owns the sessions it creates.
type Principal struct {
	Tenant string
	// Method is "api_key" or "jwt".
	Method string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal in ctx.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// MaxTokenLen bounds the bearer tokens we look at.
const MaxTokenLen = 8192

// AuthConfig configures token verification.
type AuthConfig struct {
	// APIKeys maps key to tenant.
	APIKeys map[string]string
	// JWTSecret enables HS256 tokens.
	JWTSecret []byte
	// JWTPublicKey enables RS256 (RSA key) or EdDSA (Ed25519 key) tokens.
	JWTPublicKey crypto.PublicKey
	JWTIssuer    string
	JWTAudience  string
	// JWTTenantClaim names the claim, a non-empty string, that holds a JWT
	// principal's tenant (default "sub").
	JWTTenantClaim string
	// JWTTenantPrefix is put before that claim's value to make the tenant,
	// so that JWT subjects and API-key tenants cannot name the same tenant
	// by accident. nil means DefaultJWTTenantPrefix; point it at "" to let
	// a JWT subject and an API key share a tenant on purpose.
	JWTTenantPrefix *string
}

// Defaults of the JWT tenant mapping.
const (
	DefaultJWTTenantClaim  = "sub"
	DefaultJWTTenantPrefix = "jwt:"
)

type apiKey struct {
	hash   [32]byte
	tenant string
}

// Verifier turns bearer tokens into principals.
type Verifier struct {
	keys   []apiKey
	parser *jwt.Parser
	cfg    AuthConfig
	claim  string // the tenant claim
	prefix string // before the tenant claim's value
}

// NewVerifier returns a Verifier for cfg.
func NewVerifier(cfg AuthConfig) (*Verifier, error) {
	v := &Verifier{cfg: cfg, claim: cfg.JWTTenantClaim, prefix: DefaultJWTTenantPrefix}
	if v.claim == "" {
		v.claim = DefaultJWTTenantClaim
	}
	if cfg.JWTTenantPrefix != nil {
		v.prefix = *cfg.JWTTenantPrefix
	}
	for k, t := range cfg.APIKeys {
		if k == "" || t == "" {
			return nil, errors.New("api key and tenant must not be empty")
		}
		v.keys = append(v.keys, apiKey{hash: sha256.Sum256([]byte(k)), tenant: t})
	}
	var methods []string
	if len(cfg.JWTSecret) > 0 {
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	switch cfg.JWTPublicKey.(type) {
	case nil:
	case *rsa.PublicKey:
		methods = append(methods, jwt.SigningMethodRS256.Alg())
	case ed25519.PublicKey:
		methods = append(methods, jwt.SigningMethodEdDSA.Alg())
	default:
		return nil, fmt.Errorf("unsupported JWT public key type %T (want RSA or Ed25519)", cfg.JWTPublicKey)
	}
	if len(methods) > 0 {
		opts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithExpirationRequired(), jwt.WithLeeway(0)}
		if cfg.JWTIssuer != "" {
			opts = append(opts, jwt.WithIssuer(cfg.JWTIssuer))
		}
		if cfg.JWTAudience != "" {
			opts = append(opts, jwt.WithAudience(cfg.JWTAudience))
		}
		v.parser = jwt.NewParser(opts...)
	}
	return v, nil
}

// Verify returns the principal for token, or ErrUnauthorized.
func (v *Verifier) Verify(token string) (Principal, error) {
	if token == "" || len(token) > MaxTokenLen {
		return Principal{}, ErrUnauthorized
	}
	h := sha256.Sum256([]byte(token))
	tenant := ""
	for _, k := range v.keys { // compare all keys: no early exit
		if subtle.ConstantTimeCompare(h[:], k.hash[:]) == 1 {
			tenant = k.tenant
		}
	}
	if tenant != "" {
		return Principal{Tenant: tenant, Method: "api_key"}, nil
	}
	if v.parser == nil || strings.Count(token, ".") != 2 {
		return Principal{}, ErrUnauthorized
	}
	var claims tenantClaims
	if _, err := v.parser.ParseWithClaims(token, &claims, v.key); err != nil {
		return Principal{}, ErrUnauthorized
	}
	var name string
	if raw, ok := claims.all[v.claim]; !ok || json.Unmarshal(raw, &name) != nil || name == "" {
		return Principal{}, ErrUnauthorized // missing, empty or not a string
	}
	return Principal{Tenant: v.prefix + name, Method: "jwt"}, nil
}

// tenantClaims are the registered claims the parser validates, plus every
// claim as raw JSON, from which Verify takes the tenant claim.
type tenantClaims struct {
	jwt.RegisteredClaims
	all map[string]json.RawMessage
}

func (c *tenantClaims) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, &c.RegisteredClaims); err != nil {
		return err
	}
	if err := json.Unmarshal(data, &c.all); err != nil {
		return err
	}
	// RFC 7519 §2: a NumericDate is a JSON number. The parser also takes
	// a string of digits ("exp": "9999999999"), which a token must not use.
	for _, name := range []string{"exp", "nbf", "iat"} {
		if raw, ok := c.all[name]; ok && !isJSONNumber(raw) {
			return fmt.Errorf("claim %s is not a number", name)
		}
	}
	return nil
}

// isJSONNumber reports whether raw, a valid JSON value, is a number.
func isJSONNumber(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && (b[0] == '-' || b[0] >= '0' && b[0] <= '9')
}

// key returns the verification key for t's algorithm: the HMAC secret only
// for HS256 and the public key only for its own algorithm, so a token
// signed with HS256 over the public key cannot verify.
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if len(v.cfg.JWTSecret) > 0 {
			return v.cfg.JWTSecret, nil
		}
	case *jwt.SigningMethodRSA:
		if k, ok := v.cfg.JWTPublicKey.(*rsa.PublicKey); ok {
			return k, nil
		}
	case *jwt.SigningMethodEd25519:
		if k, ok := v.cfg.JWTPublicKey.(ed25519.PublicKey); ok {
			return k, nil
		}
	}
	return nil, errors.New("no key for algorithm")
}

// ParsePublicKeyPEM parses a PKIX ("PUBLIC KEY") or PKCS#1 ("RSA PUBLIC
// KEY") PEM block, or a certificate.
func ParsePublicKeyPEM(data []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return c.PublicKey, nil
	}
	return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
}
