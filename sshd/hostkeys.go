package sshd

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	gossh "golang.org/x/crypto/ssh"
)

// LoadOrCreateHostKeys returns the gateway's host keys (ed25519 first, then
// RSA for old clients), generating and storing any that are missing in dir.
func LoadOrCreateHostKeys(dir string) ([]gossh.Signer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("host key dir: %w", err)
	}
	gens := []struct {
		name string
		gen  func() (crypto.PrivateKey, error)
	}{
		{"ssh_host_ed25519_key", func() (crypto.PrivateKey, error) {
			_, k, err := ed25519.GenerateKey(rand.Reader)
			return k, err
		}},
		{"ssh_host_rsa_key", func() (crypto.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 3072) }},
	}
	var signers []gossh.Signer
	for _, g := range gens {
		path := filepath.Join(dir, g.name)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			data, err = writeNewKey(path, g.gen)
		}
		if err != nil {
			return nil, fmt.Errorf("host key %s: %w", path, err)
		}
		s, err := gossh.ParsePrivateKey(data)
		if err != nil {
			return nil, fmt.Errorf("parse host key %s: %w", path, err)
		}
		signers = append(signers, s)
	}
	return signers, nil
}

func writeNewKey(path string, gen func() (crypto.PrivateKey, error)) ([]byte, error) {
	k, err := gen()
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(k, "sandgate host key")
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	data := pem.EncodeToMemory(block)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	return data, nil
}

// AuthorizedKeys returns each signer's public key as an authorized_keys
// line without a trailing newline.
func AuthorizedKeys(signers []gossh.Signer) []string {
	out := make([]string, 0, len(signers))
	for _, s := range signers {
		out = append(out, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(s.PublicKey()))))
	}
	return out
}
