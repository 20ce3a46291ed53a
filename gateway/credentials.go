package gateway

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"strings"
)

// NewAPIKey returns a random API key: "sg_" (so that a leaked key is easy
// to recognise) and 43 base64url characters (256 random bits).
func NewAPIKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "sg_" + base64.RawURLEncoding.EncodeToString(b)
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns a session id: "sbx-" and 20 base32 characters (100 random
// bits), valid as a hostname label.
func newID() string {
	b := make([]byte, 13)
	_, _ = rand.Read(b)
	return "sbx-" + idEncoding.EncodeToString(b)[:20]
}

// newPassword returns a random SSH password.
func newPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return strings.TrimRight(base32.StdEncoding.EncodeToString(b), "=")
}
