package egress

import (
	"errors"
	"net/netip"
	"sync"
)

// NamePrefix is the private range the transparent egress's resolver
// answers from (RFC 2544's benchmarking range, routed nowhere): inside a
// sandbox an address of it stands for the name it was given for. Its
// first /24 is kept for the sandbox's own address.
var NamePrefix = netip.MustParsePrefix("198.18.0.0/15")

// MaxNames bounds the names a session's resolver remembers (per session):
// past it, new names get SERVFAIL.
const MaxNames = 4096

// MaxNamesPerTenant and MaxNamesTotal bound the names the resolvers of a
// tenant's sessions, and of all sessions, remember (each name costs the
// gateway its memory until its session ends): past one, new names get
// SERVFAIL as past MaxNames.
const (
	MaxNamesPerTenant = 4 * MaxNames
	MaxNamesTotal     = 64 * MaxNames
)

var (
	errNamesFull       = errors.New("this session's resolver remembers as many names as it may")
	errNamesTenantFull = errors.New("this tenant's sessions' resolvers remember as many names as they may")
	errNamesTotalFull  = errors.New("the gateway's resolvers remember as many names as they may")
)

// nameCounts counts the names of every session's resolver, per tenant and
// in all, against MaxNamesPerTenant and MaxNamesTotal.
type nameCounts struct {
	mu     sync.Mutex
	tenant map[string]int
	total  int
}

// take counts one more name of tenant's; an error names the bound crossed.
func (c *nameCounts) take(tenant string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total >= MaxNamesTotal {
		return errNamesTotalFull
	}
	if c.tenant[tenant] >= MaxNamesPerTenant {
		return errNamesTenantFull
	}
	if c.tenant == nil {
		c.tenant = make(map[string]int)
	}
	c.tenant[tenant]++
	c.total++
	return nil
}

// release gives back n names of tenant's.
func (c *nameCounts) release(tenant string, n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total -= n
	if c.tenant[tenant] -= n; c.tenant[tenant] <= 0 {
		delete(c.tenant, tenant) // a nil map's delete is fine
	}
}

// names is one session's mapping of names to addresses of NamePrefix. A
// name keeps its address for the session's life.
type names struct {
	mu      sync.Mutex
	byName  map[string]netip.Addr
	byAddr  map[netip.Addr]string
	next    netip.Addr
	closed  bool // the session ended: its names were given back
	counted int  // the names take counted
}

func newNames() *names {
	return &names{
		byName: make(map[string]netip.Addr),
		byAddr: make(map[netip.Addr]string),
		next:   netip.MustParseAddr("198.18.1.0"),
	}
}

// addrFor returns name's address, giving it the next one when it has none
// and take (nil: none) counts it.
func (n *names) addrFor(name string, take func() error) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.byName[name]; ok {
		return a, nil
	}
	if n.closed || len(n.byName) >= MaxNames || !NamePrefix.Contains(n.next) {
		return netip.Addr{}, errNamesFull
	}
	if take != nil {
		if err := take(); err != nil {
			return netip.Addr{}, err
		}
		n.counted++
	}
	a := n.next
	n.next = a.Next()
	n.byName[name], n.byAddr[a] = a, name
	return a, nil
}

// nameAt returns the name a stands for.
func (n *names) nameAt(a netip.Addr) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	name, ok := n.byAddr[a]
	return name, ok
}

// close ends the giving of new names and returns how many take counted.
func (n *names) close() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0
	}
	n.closed = true
	return n.counted
}
