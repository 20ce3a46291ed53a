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

var errNamesFull = errors.New("this session's resolver remembers as many names as it may")

// names is one session's mapping of names to addresses of NamePrefix. A
// name keeps its address for the session's life.
type names struct {
	mu     sync.Mutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
	next   netip.Addr
}

func newNames() *names {
	return &names{
		byName: make(map[string]netip.Addr),
		byAddr: make(map[netip.Addr]string),
		next:   netip.MustParseAddr("198.18.1.0"),
	}
}

// addrFor returns name's address, giving it the next one when it has none.
func (n *names) addrFor(name string) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.byName[name]; ok {
		return a, nil
	}
	if len(n.byName) >= MaxNames || !NamePrefix.Contains(n.next) {
		return netip.Addr{}, errNamesFull
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
