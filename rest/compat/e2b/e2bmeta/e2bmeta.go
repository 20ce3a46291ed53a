// Package e2bmeta is what the E2B facade (rest/compat/e2b) keeps of a
// sandbox's create beside the session: a record in the session's metadata
// under the key Key, which both the control API (templateID, the user's
// metadata, autoPause) and envd (envVars, which every command gets) read.
// The user's E2B metadata is the rest of the session's metadata (its
// labels): string values at the top level.
//
// The envVars may be secrets, and /v1 shows a session's metadata: the
// record holds them sealed (AES-256-GCM under a key derived from the
// gateway's key, Sealer), so that no API returns them.
package e2bmeta

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"

	"github.com/sandgate/sandgate/gateway"
)

// Key is the metadata key of the record. A create through the E2B API
// that gives a metadata key of this name is refused.
const Key = "_e2b"

// Record is what a create through the E2B API asked for, as kept.
type Record struct {
	// TemplateID is the create's templateID.
	TemplateID string `json:"templateID"`
	// EnvVars are the sandbox's environment variables (envVars): every
	// command envd starts gets them, under its own. They are kept sealed
	// (SealedEnv): Sealer.Metadata seals them, Sealer.Of opens them.
	EnvVars map[string]string `json:"-"`
	// SealedEnv is EnvVars as JSON, sealed by a Sealer (base64 of the
	// nonce and the ciphertext).
	SealedEnv string `json:"sealedEnv,omitempty"`
	// Secure is what the create said (every sandbox URL call needs the
	// access token whatever it says).
	Secure bool `json:"secure,omitempty"`
	// AutoPause: the create asked that the timeout pause the sandbox.
	AutoPause bool `json:"autoPause,omitempty"`
	// TokenNonce is mixed into the sandbox's access token (a random
	// string).
	TokenNonce string `json:"tokenNonce,omitempty"`
	// Timeout is the create's timeout in seconds: an autoPause sandbox
	// resumed by a sandbox URL call (not by connect, which gives its own)
	// pauses again that long after.
	Timeout int `json:"timeout,omitempty"`
}

// Of is s's record, or false for a session not created through the E2B
// API (or whose record does not decode). Its EnvVars are not opened: see
// Sealer.Of.
func Of(s *gateway.Session) (Record, bool) {
	return FromMetadata(s.Metadata)
}

// Sealer seals and opens records' envVars.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer is a Sealer under a key derived from key (the gateway's
// link key): HMAC-SHA256 of the label "e2b-env-vars".
func NewSealer(key []byte) *Sealer {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("e2b-env-vars"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key is AES-256's
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &Sealer{aead: aead}
}

// Of is s's record with its EnvVars opened (none when they do not open:
// sealed under another key, or made up).
func (sl *Sealer) Of(s *gateway.Session) (Record, bool) {
	r, ok := Of(s)
	if !ok || r.SealedEnv == "" {
		return r, ok
	}
	b, err := base64.RawStdEncoding.DecodeString(r.SealedEnv)
	ns := sl.aead.NonceSize()
	if err != nil || len(b) < ns {
		return r, true
	}
	plain, err := sl.aead.Open(nil, b[:ns], b[ns:], []byte(Key))
	if err != nil {
		return r, true
	}
	_ = json.Unmarshal(plain, &r.EnvVars)
	return r, true
}

// Metadata is the session metadata of a create (Record.Metadata) with
// the record's EnvVars sealed.
func (sl *Sealer) Metadata(r Record, user map[string]string) (map[string]any, error) {
	r.SealedEnv = ""
	if len(r.EnvVars) > 0 {
		plain, err := json.Marshal(r.EnvVars)
		if err != nil {
			return nil, err
		}
		nonce := make([]byte, sl.aead.NonceSize())
		_, _ = rand.Read(nonce)
		r.SealedEnv = base64.RawStdEncoding.EncodeToString(sl.aead.Seal(nonce, nonce, plain, []byte(Key)))
	}
	return r.Metadata(user)
}

// FromMetadata is the record in a session's metadata md.
func FromMetadata(md map[string]any) (Record, bool) {
	v, ok := md[Key]
	if !ok {
		return Record{}, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Record{}, false
	}
	var r Record
	if json.Unmarshal(b, &r) != nil {
		return Record{}, false
	}
	return r, true
}

// Metadata is the session metadata of a create: the user's metadata with
// the record under Key (its EnvVars left out: Sealer.Metadata seals them).
func (r Record) Metadata(user map[string]string) (map[string]any, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, err
	}
	md := make(map[string]any, len(user)+1)
	for k, v := range user {
		md[k] = v
	}
	md[Key] = rec
	return md, nil
}

// UserMetadata is the E2B metadata of a session's metadata md: its
// string values at the top level, the record left out.
func UserMetadata(md map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range md {
		if s, ok := v.(string); ok && k != Key {
			out[k] = s
		}
	}
	return out
}
