package kube

import (
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

// SecretOverlay is a gateway.SecretSource over the operator's source
// (--secrets-file) that also holds the values the controller read from
// Kubernetes Secrets (and SandboxClaims' env) for one session each: a
// scope (gateway.CreateParams.SecretScope, the Session's or claim's UID)
// maps names to values. A session sees only its own scope's values, over
// the operator's; two Sessions of a tenant that give one name different
// values each get their own.
type SecretOverlay struct {
	base gateway.SecretSource // nil: none

	mu     sync.RWMutex
	scopes map[string]map[string]string // scope -> name -> value
}

var (
	_ gateway.ScopedSecrets = (*SecretOverlay)(nil)
	_ gateway.SecretPins    = (*SecretOverlay)(nil)
	_ gateway.SecretKeys    = (*SecretOverlay)(nil)
	_ gateway.SecretsLoaded = scopedSecrets{}
)

// NewSecretOverlay returns an overlay over base (which may be nil).
func NewSecretOverlay(base gateway.SecretSource) *SecretOverlay {
	return &SecretOverlay{base: base, scopes: map[string]map[string]string{}}
}

// Set makes scope's values vals (replacing what scope had).
func (o *SecretOverlay) Set(scope string, vals map[string]string) {
	m := make(map[string]string, len(vals))
	for k, v := range vals {
		m[k] = v
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.scopes[scope] = m
}

// Drop forgets scope's values (its session is gone).
func (o *SecretOverlay) Drop(scope string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.scopes, scope)
}

// Has reports whether scope's values are loaded (Set and not dropped
// since): after a gateway restart none are until the controller reads its
// Secrets again.
func (o *SecretOverlay) Has(scope string) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	_, ok := o.scopes[scope]
	return ok
}

// Len is how many scopes hold values.
func (o *SecretOverlay) Len() int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return len(o.scopes)
}

// value is scope's value of name; loaded is false when scope's values are
// not loaded at all.
func (o *SecretOverlay) value(scope, name string) (v string, ok, loaded bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	m, loaded := o.scopes[scope]
	v, ok = m[name]
	return v, ok, loaded
}

// Scoped implements gateway.ScopedSecrets.
func (o *SecretOverlay) Scoped(scope string) gateway.SecretSource {
	return scopedSecrets{o: o, scope: scope}
}

// Lookup implements gateway.SecretSource: the operator's values only.
func (o *SecretOverlay) Lookup(tenant, name string) (string, bool) {
	if o.base == nil {
		return "", false
	}
	return o.base.Lookup(tenant, name)
}

// Pins implements gateway.SecretPins: the operator's pins.
func (o *SecretOverlay) Pins(tenant, name string) (egress.Bounds, bool) {
	if p, ok := o.base.(gateway.SecretPins); ok {
		return p.Pins(tenant, name)
	}
	return egress.Bounds{}, false
}

// SSHKey implements gateway.SecretKeys: the operator's keys.
func (o *SecretOverlay) SSHKey(tenant, name string) (ssh.Signer, bool) {
	if k, ok := o.base.(gateway.SecretKeys); ok {
		return k.SSHKey(tenant, name)
	}
	return nil, false
}

// scopedSecrets is one session's view: its scope's values, over the
// operator's. While the scope is not loaded (a gateway restarted and its
// controller has not read the Secrets again yet) it answers nothing: the
// operator's value of the same name never stands in for the session's
// (and Session.Start refuses with secret_unavailable, SecretsLoaded).
type scopedSecrets struct {
	o     *SecretOverlay
	scope string
}

// Loaded implements gateway.SecretsLoaded.
func (s scopedSecrets) Loaded() bool { return s.o.Has(s.scope) }

func (s scopedSecrets) Lookup(tenant, name string) (string, bool) {
	v, ok, loaded := s.o.value(s.scope, name)
	if ok {
		return v, true
	}
	if !loaded {
		return "", false
	}
	return s.o.Lookup(tenant, name)
}

// Pins: a value from Kubernetes is the tenant's own and pinned nowhere;
// the operator's keep their pins.
func (s scopedSecrets) Pins(tenant, name string) (egress.Bounds, bool) {
	if _, ok, loaded := s.o.value(s.scope, name); ok || !loaded {
		return egress.Bounds{}, false
	}
	return s.o.Pins(tenant, name)
}

func (s scopedSecrets) SSHKey(tenant, name string) (ssh.Signer, bool) {
	if _, ok, loaded := s.o.value(s.scope, name); ok || !loaded {
		return nil, false
	}
	return s.o.SSHKey(tenant, name)
}
