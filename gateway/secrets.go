package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/sandgate/sandgate/egress"
)

// SecretSource resolves the operator's secrets by name for a tenant. A
// session stores only the names; values are looked up when a process
// starts (or a request is sent upstream), so a reload applies at once.
type SecretSource interface {
	Lookup(tenant, name string) (value string, ok bool)
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

// SecretsFile is a SecretSource read from a file (serve --secrets-file):
// one NAME=value per line, visible to every tenant, or tenant/NAME=value,
// visible to that tenant only, where it wins over a NAME=value. Either
// may pin the secret to hosts, NAME@host,host=value: those are --egress-allow
// patterns (api.github.com, *.example.com, with an optional :port), and
// the secret then only goes to them, bound (SecretPins). Blank lines and
// lines starting with # are skipped; the value is the rest of the line,
// as it is. Reload re-reads it; a file that does not parse keeps the
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
}

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
		if !validEnvName(name) || (scoped && tenant == "") {
			return fmt.Errorf("secrets file %s line %d: %q is not a valid secret name (letters, digits and _, not starting with a digit)", f.path, n, key)
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
