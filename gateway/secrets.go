package gateway

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/egress"
)

// SecretSource resolves the operator's secrets by name for a tenant. A
// session stores only the names; values are looked up when a process
// starts (or a request is sent upstream), so a reload applies at once.
type SecretSource interface {
	Lookup(tenant, name string) (value string, ok bool)
}

// ScopedSecrets is implemented by a SecretSource that also holds values
// given for one session alone (CreateParams.SecretScope): Scoped is the
// source such a session looks its secrets up in.
type ScopedSecrets interface {
	Scoped(scope string) SecretSource
}

// SecretsLoaded is implemented by a scoped SecretSource whose values may
// not be loaded yet (kube's, after a gateway restart, until its controller
// reads the Kubernetes Secrets again). While Loaded is false a process of
// a session with secrets does not start (secret_unavailable): it never
// runs without, or with another, value of its secrets.
type SecretsLoaded interface {
	Loaded() bool
}

// errSecretUnavailable is a process start refused while the session's
// scoped secrets are not loaded.
var errSecretUnavailable = &Error{Kind: KindUnavailable, Code: "secret_unavailable",
	Message: "the session's secrets are not loaded yet (the gateway restarted and is reading them again); retry shortly"}

// secretsReady is errSecretUnavailable while s has secrets its source has
// not loaded.
func (s *Session) secretsReady() error {
	if len(s.Secrets) == 0 {
		return nil
	}
	if l, ok := s.secrets.(SecretsLoaded); ok && !l.Loaded() {
		return errSecretUnavailable
	}
	return nil
}

// secretSource is the source of the secrets of a session created with
// scope (nil when the gateway has none).
func (m *Manager) secretSource(scope string) SecretSource {
	if m.cfg.Secrets == nil {
		return nil
	}
	if sc, ok := m.cfg.Secrets.(ScopedSecrets); ok && scope != "" {
		return sc.Scoped(scope)
	}
	return m.cfg.Secrets
}

// SecretPins is implemented by a SecretSource whose operator may pin a
// secret to hosts: such a secret is only ever sent as a header to those
// hosts (a session must bind it to some of them), never put in a
// sandbox's environment.
type SecretPins interface {
	// Pins returns the hosts tenant's secret name is pinned to (patterns
	// as --egress-allow takes them); ok is false when it is not pinned.
	Pins(tenant, name string) (hosts egress.Bounds, ok bool)
}

// secretPins is src's pins of tenant's secret name, if src has pins.
func secretPins(src SecretSource, tenant, name string) (egress.Bounds, bool) {
	if p, ok := src.(SecretPins); ok {
		return p.Pins(tenant, name)
	}
	return egress.Bounds{}, false
}

// SecretKeys is implemented by a SecretSource whose secrets may be SSH
// private keys (the secrets file's ssh-key: values). Such a secret is
// always pinned to hosts, and is never a header nor an environment
// variable: the session's SSH agent signs with it (sshagent.go), and
// Lookup answers "" for it.
type SecretKeys interface {
	SSHKey(tenant, name string) (ssh.Signer, bool)
}

// secretKey is src's SSH key tenant's secret name, if it is one.
func secretKey(src SecretSource, tenant, name string) (ssh.Signer, bool) {
	if k, ok := src.(SecretKeys); ok {
		return k.SSHKey(tenant, name)
	}
	return nil, false
}

// SecretsFile is a SecretSource read from a file (serve --secrets-file):
// one NAME=value per line, visible to every tenant, or tenant/NAME=value,
// visible to that tenant only, where it wins over a NAME=value. Either
// may pin the secret to hosts, NAME@host,host=value: those are --egress-allow
// patterns (api.github.com, *.example.com, with an optional :port), and
// the secret then only goes to them, bound (SecretPins). Blank lines and
// lines starting with # are skipped; the value is the rest of the line,
// as it is. A value ssh-key:/abs/path/to/key or ssh-key:base64:<the key
// file in base64> is an SSH private key (unencrypted, in OpenSSH or PEM
// form), which must be pinned (NAME@git.example.com:22=ssh-key:...) and
// is offered to sessions through their SSH agent (SecretKeys); the key
// file is read by each Reload. Reload re-reads it; a file that does not parse keeps the
// previous definitions.
type SecretsFile struct {
	path string

	mu      sync.RWMutex
	global  map[string]secretEntry
	tenants map[string]map[string]secretEntry
}

// secretEntry is one secret of the file.
type secretEntry struct {
	value  string
	pinned bool
	pins   egress.Bounds
	key    ssh.Signer // an ssh-key secret (value is then "")
}

// sshKeyPrefix marks a secrets file value that is an SSH private key.
const sshKeyPrefix = "ssh-key:"

// maxKeyFile bounds an ssh-key secret's key file.
const maxKeyFile = 64 << 10

// maxSecretsFile bounds the file read.
const maxSecretsFile = 4 << 20

// OpenSecrets reads the secrets file at path.
func OpenSecrets(path string) (*SecretsFile, error) {
	f := &SecretsFile{path: path}
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload re-reads the file. Its errors name lines, never values.
func (f *SecretsFile) Reload() error {
	b, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("secrets file: %w", err)
	}
	if len(b) > maxSecretsFile {
		return fmt.Errorf("secrets file %s: larger than %d bytes", f.path, maxSecretsFile)
	}
	global, tenants := map[string]secretEntry{}, map[string]map[string]secretEntry{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxSecretsFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("secrets file %s line %d: want NAME=value, tenant/NAME=value, or either with @host,host after the name", f.path, n)
		}
		// The tenant ends at the last "/": it may hold "@" (JWT tenants
		// are jwt:<sub>, often an e-mail address), and neither the name
		// nor the pinned hosts hold "/".
		tenant, name, scoped := "", key, false
		if i := strings.LastIndexByte(key, '/'); i >= 0 {
			tenant, name, scoped = key[:i], key[i+1:], true
		}
		name, hosts, pinned := strings.Cut(name, "@")
		if scoped {
			key = tenant + "/" + name
		} else {
			key = name
		}
		// Checked first, and not shown: a line that is no NAME=value (a
		// key file pasted in, its base64 padding "=") must not be echoed.
		if !validEnvName(name) || (scoped && tenant == "") {
			return fmt.Errorf("secrets file %s line %d: what stands before \"=\" is not a valid secret name (letters, digits and _, not starting with a digit, after an optional tenant/)", f.path, n)
		}
		e := secretEntry{value: value, pinned: pinned}
		if pinned {
			var pats []string
			for h := range strings.SplitSeq(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					pats = append(pats, h)
				}
			}
			b, err := egress.ParseBounds(pats)
			if err != nil || len(pats) == 0 {
				why := "no hosts after @"
				if err != nil {
					why = err.Error()
				}
				return fmt.Errorf("secrets file %s line %d: %s is pinned to bad hosts: %s", f.path, n, key, why)
			}
			e.pins = b
		}
		if v, isKey := strings.CutPrefix(value, sshKeyPrefix); isKey {
			if !pinned {
				return fmt.Errorf("secrets file %s line %d: %s is an ssh-key: pin it to the hosts it signs for (%s@git.example.com:22=ssh-key:...)", f.path, n, key, key)
			}
			k, err := loadSSHKey(v)
			if err != nil {
				return fmt.Errorf("secrets file %s line %d: %s: %w", f.path, n, key, err)
			}
			e.key, e.value = k, ""
		}
		m := global
		if scoped {
			if m = tenants[tenant]; m == nil {
				m = map[string]secretEntry{}
				tenants[tenant] = m
			}
		}
		if _, dup := m[name]; dup {
			return fmt.Errorf("secrets file %s line %d: %s is defined twice", f.path, n, key)
		}
		m[name] = e
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("secrets file %s: %w", f.path, err)
	}
	f.mu.Lock()
	f.global, f.tenants = global, tenants
	f.mu.Unlock()
	return nil
}

// Lookup implements SecretSource.
func (f *SecretsFile) Lookup(tenant, name string) (string, bool) {
	e, ok := f.entry(tenant, name)
	return e.value, ok
}

// SSHKey implements SecretKeys.
func (f *SecretsFile) SSHKey(tenant, name string) (ssh.Signer, bool) {
	e, ok := f.entry(tenant, name)
	return e.key, ok && e.key != nil
}

// loadSSHKey parses an ssh-key value (after "ssh-key:"): base64:<the key
// file's bytes in base64>, or the absolute path of the key file. Its
// errors never hold the key.
func loadSSHKey(v string) (ssh.Signer, error) {
	var pemBytes []byte
	if b64, ok := strings.CutPrefix(v, "base64:"); ok {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil {
			return nil, errors.New("ssh-key:base64: is not valid base64")
		}
		pemBytes = b
	} else {
		if !filepath.IsAbs(v) {
			return nil, errors.New("ssh-key: wants an absolute path to a key file or base64:<key>")
		}
		kf, err := os.Open(v)
		if err != nil {
			return nil, fmt.Errorf("ssh-key: %w", err)
		}
		defer kf.Close()
		b, err := io.ReadAll(io.LimitReader(kf, maxKeyFile+1))
		if err != nil {
			return nil, fmt.Errorf("ssh-key: %w", err)
		}
		if len(b) > maxKeyFile {
			return nil, fmt.Errorf("ssh-key: %s is larger than %d bytes", v, maxKeyFile)
		}
		pemBytes = b
	}
	k, err := ssh.ParsePrivateKey(pemBytes)
	var pass *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &pass):
		return nil, errors.New("ssh-key: the key is passphrase-protected; give the gateway an unencrypted key (ssh-keygen -p -N '')")
	case err != nil:
		return nil, errors.New("ssh-key: not an SSH private key sandgate can read (OpenSSH or PEM; RSA, ECDSA or Ed25519)")
	}
	return k, nil
}

// Pins implements SecretPins.
func (f *SecretsFile) Pins(tenant, name string) (egress.Bounds, bool) {
	e, ok := f.entry(tenant, name)
	return e.pins, ok && e.pinned
}

// entry is tenant's secret name: the tenant's own, or else the global one.
func (f *SecretsFile) entry(tenant, name string) (secretEntry, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if e, ok := f.tenants[tenant][name]; ok {
		return e, true
	}
	e, ok := f.global[name]
	return e, ok
}

// Count is how many secrets the file defines, for the start-up log.
func (f *SecretsFile) Count() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := len(f.global)
	for _, m := range f.tenants {
		n += len(m)
	}
	return n
}

// validEnvName reports whether s can name an environment variable.
func validEnvName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
