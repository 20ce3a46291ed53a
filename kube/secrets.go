package kube

import (
	"sync"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

// SecretOverlay is a gateway.SecretSource: the values the controller read
// from Kubernetes Secrets (and SandboxClaims' env) for a tenant, by the
// name a session asks for, over the operator's source (--secrets-file).
// A tenant's value of a name is the one last read: Sessions of one
// namespace that give the same name different values get the latest.
type SecretOverlay struct {
	base gateway.SecretSource // nil: none

	mu     sync.RWMutex
	values map[string]map[string]string // tenant -> name -> value
}

// NewSecretOverlay returns an overlay over base (which may be nil).
func NewSecretOverlay(base gateway.SecretSource) *SecretOverlay {
	return &SecretOverlay{base: base, values: map[string]map[string]string{}}
}

// Set makes name's value for tenant v.
func (o *SecretOverlay) Set(tenant, name, v string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.values[tenant]
	if m == nil {
		m = map[string]string{}
		o.values[tenant] = m
	}
	m[name] = v
}

// Lookup implements gateway.SecretSource.
func (o *SecretOverlay) Lookup(tenant, name string) (string, bool) {
	o.mu.RLock()
	v, ok := o.values[tenant][name]
	o.mu.RUnlock()
	if ok {
		return v, true
	}
	if o.base == nil {
		return "", false
	}
	return o.base.Lookup(tenant, name)
}

// Pins implements gateway.SecretPins: a value from Kubernetes is the
// tenant's own and pinned nowhere; the operator's keep their pins.
func (o *SecretOverlay) Pins(tenant, name string) (egress.Bounds, bool) {
	o.mu.RLock()
	_, ok := o.values[tenant][name]
	o.mu.RUnlock()
	if ok {
		return egress.Bounds{}, false
	}
	if p, isPins := o.base.(gateway.SecretPins); isPins {
		return p.Pins(tenant, name)
	}
	return egress.Bounds{}, false
}
