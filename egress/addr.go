package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
)

// refusedPrefixes are never dialed unless inside an AllowCIDRs prefix.
// Addresses are unmapped (::ffff:a.b.c.d -> a.b.c.d) before the check.
var refusedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("10.0.0.0/8"),      // RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),   // CGNAT
	netip.MustParsePrefix("127.0.0.0/8"),     // loopback
	netip.MustParsePrefix("169.254.0.0/16"),  // link-local (cloud metadata)
	netip.MustParsePrefix("172.16.0.0/12"),   // RFC 1918
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.168.0.0/16"),  // RFC 1918
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("224.0.0.0/4"),     // multicast
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, broadcast
	netip.MustParsePrefix("::/96"),           // unspecified, loopback, IPv4-compatible
	netip.MustParsePrefix("fc00::/7"),        // ULA
	netip.MustParsePrefix("fe80::/10"),       // link-local
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated)
	netip.MustParsePrefix("ff00::/8"),        // multicast
	netip.MustParsePrefix("::ffff:0:0/96"),   // IPv4-mapped that did not unmap (never, but cheap)
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("100::/64"),        // discard-only
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
}

// denial is a request refused before any byte reached the destination:
// Status 403 for policy, 502 for resolution or dial failures.
type denial struct {
	Status int
	Reason string
	Code   string // a stable code for the X-Sandgate-Code header, "" when none
}

func (d *denial) Error() string { return d.Reason }

func denied(status int, format string, args ...any) *denial {
	return &denial{Status: status, Reason: fmt.Sprintf(format, args...)}
}

// addrAllowed is the address rule: inside an AllowCIDRs prefix, or public
// and not one of the gateway's own addresses.
func (p *Proxy) addrAllowed(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, pf := range p.allowCIDRs {
		if pf.Contains(a) {
			return true
		}
	}
	if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsPrivate() ||
		a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsMulticast() || a.IsInterfaceLocalMulticast() {
		return false
	}
	for _, pf := range refusedPrefixes {
		if pf.Contains(a) {
			return false
		}
	}
	return !p.own[a]
}

// resolve returns host's candidate addresses: the IP literal itself, or
// the static Hosts entry, or the resolver's answer.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if addrs, ok := p.hosts[host]; ok {
		return addrs, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	addrs, err := p.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no addresses")
	}
	return addrs, nil
}

// allowedAddrs resolves host once and returns the candidates the address
// rule allows; none is a *denial, with the first refused address.
func (p *Proxy) allowedAddrs(ctx context.Context, host string) ([]netip.Addr, netip.Addr, error) {
	addrs, err := p.resolve(ctx, host)
	if err != nil {
		if ctx.Err() != nil {
			return nil, netip.Addr{}, denied(http.StatusBadGateway, "cannot resolve: %v", ctx.Err())
		}
		return nil, netip.Addr{}, denied(http.StatusBadGateway, "cannot resolve")
	}
	var ok []netip.Addr
	var refused netip.Addr
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if p.addrAllowed(a) {
			ok = append(ok, a)
		} else if !refused.IsValid() {
			refused = a
		}
	}
	if len(ok) == 0 {
		if _, err := netip.ParseAddr(host); err == nil {
			return nil, refused, denied(http.StatusForbidden, "private address %s", refused)
		}
		// A name's address is the gateway's to know (db.internal is
		// 10.1.2.3): the caller logs it, the tenant sees the name only.
		return nil, refused, denied(http.StatusForbidden, "resolves to a private address")
	}
	return ok, netip.Addr{}, nil
}

// dialChecked resolves host once, checks every candidate with the address
// rule and dials exactly a checked address; the dialer never resolves. host
// is normalized. The error is a *denial.
func (p *Proxy) dialChecked(ctx context.Context, host string, port uint16) (net.Conn, netip.Addr, error) {
	ok, refused, err := p.allowedAddrs(ctx, host)
	if err != nil {
		return nil, refused, err
	}
	var lastErr error
	for _, a := range ok {
		target := netip.AddrPortFrom(a, port)
		d := net.Dialer{
			Timeout: p.cfg.DialTimeout,
			// Belt and braces: the socket connects to the checked address
			// or not at all.
			Control: func(network, address string, _ syscall.RawConn) error {
				got, err := netip.ParseAddrPort(address)
				if err != nil || got.Addr().Unmap() != a || got.Port() != port {
					return fmt.Errorf("connect to %s, not the checked %s", address, target)
				}
				return nil
			},
		}
		c, err := d.DialContext(ctx, "tcp", target.String())
		if err == nil {
			return c, a, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, ok[0], denied(http.StatusBadGateway, "dial failed: %v", unwrapOpError(lastErr))
}

// unwrapOpError drops net.OpError's "dial tcp a->b:" prefix noise while
// keeping the cause.
func unwrapOpError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// hostPort formats host (normalized; IPv6 bare) and port for messages.
func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// DialPublic dials addr ("host:port", TCP) for the gateway itself (the
// REST data plane's files/fetch): the host is normalized, resolved once,
// and dialled only at an address the address rule allows (public, or
// inside AllowCIDRs). No session allow-list applies. A refusal's error
// says why ("private address 127.0.0.1"; for a name, "resolves to a
// private address", without the address; "cannot resolve").
func (p *Proxy) DialPublic(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("dial %s %s: network not supported", network, addr)
	}
	host, port, err := splitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c, _, err := p.dialChecked(ctx, host, port)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", hostPort(host, port), err)
	}
	return c, nil
}

// CheckPublic applies DialPublic's address rule to addr ("host:port")
// without dialling: for a request that another hop (an HTTP proxy)
// connects. The hop resolves the name again, so this holds as far as it
// resolves it as the gateway does.
func (p *Proxy) CheckPublic(ctx context.Context, addr string) error {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return fmt.Errorf("check %s: %w", addr, err)
	}
	if _, _, err := p.allowedAddrs(ctx, host); err != nil {
		return fmt.Errorf("check %s: %w", hostPort(host, port), err)
	}
	return nil
}
