package linuxns

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// The transparent egress of a sandbox's network namespace
// (sandbox.TransparentNet): its loopback also holds SandboxAddr, the
// default route goes out on the loopback from it, and nftables in the
// namespace redirects every TCP connection to an address off the loopback
// to TransparentAddr, and DNS (UDP or TCP port 53) to ResolverAddr; other
// packets for addresses off the loopback are dropped, so a UDP send fails
// at once (EPERM) and QUIC falls back to TCP. The kernel has no dummy
// device here; the loopback route does the same: nothing leaves the
// namespace but through the gateway's sockets.
const (
	// TransparentAddr is the listener redirected TCP connections reach.
	TransparentAddr = "127.0.0.1:3129"
	// ResolverAddr is the sandbox's resolver (UDP and TCP), the one its
	// /etc/resolv.conf names.
	ResolverAddr = "127.0.0.1:53"
	// nftTable is the namespace's table of the redirects.
	nftTable = "sandgate"
)

// SandboxAddr is the sandbox's own address off the loopback, the source
// of its connections out.
var SandboxAddr = netip.MustParseAddr("198.18.0.1")

// ListenTransparent implements sandbox.TransparentNet.
func (s *linuxSandbox) ListenTransparent(ctx context.Context) (sandbox.Transparent, error) {
	s.mu.Lock()
	done, pid, stopped := s.initDone, s.st.Pid, s.st.Stopped
	s.mu.Unlock()
	if stopped {
		return sandbox.Transparent{}, sandbox.ErrStopped
	}
	select {
	case <-done:
		return sandbox.Transparent{}, sandbox.ErrClosed
	default:
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return sandbox.Transparent{}, fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer ns.Close()
	if err := routeOut(int(ns.Fd())); err != nil {
		return sandbox.Transparent{}, fmt.Errorf("sandbox default route: %w", err)
	}
	if err := redirectRules(int(ns.Fd())); err != nil {
		return sandbox.Transparent{}, fmt.Errorf("sandbox nftables redirect: %w", err)
	}
	var t sandbox.Transparent
	closeAll := func() {
		for _, c := range []interface{ Close() error }{t.TCP, t.DNSTCP, t.DNSUDP} {
			if c != nil {
				c.Close()
			}
		}
	}
	if t.TCP, err = listenIn(ctx, ns, TransparentAddr); err != nil {
		return sandbox.Transparent{}, err
	}
	if t.DNSTCP, err = listenIn(ctx, ns, ResolverAddr); err != nil {
		closeAll()
		return sandbox.Transparent{}, err
	}
	t.DNSUDP, err = inNetNS(ns, func() (net.PacketConn, error) {
		var lc net.ListenConfig
		return lc.ListenPacket(ctx, "udp", ResolverAddr)
	})
	if err != nil {
		closeAll()
		return sandbox.Transparent{}, fmt.Errorf("resolver in the sandbox: %w", err)
	}
	t.Source = SandboxAddr
	return t, nil
}

// routeOut gives the namespace's loopback (index 1 in every namespace)
// SandboxAddr and the default route out of it. Both exist already after
// a resume: EEXIST is fine.
func routeOut(nsFD int) error {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return err
	}
	defer c.Close()
	src := SandboxAddr.As4()
	addrAttrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.IFA_LOCAL, Data: src[:]},
		{Type: unix.IFA_ADDRESS, Data: src[:]},
	})
	if err != nil {
		return err
	}
	ifa := make([]byte, unix.SizeofIfAddrmsg)
	ifa[0], ifa[1], ifa[3] = unix.AF_INET, 32, unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(ifa[4:], 1)
	if err := request(c, unix.RTM_NEWADDR, append(ifa, addrAttrs...)); err != nil {
		return fmt.Errorf("address %s: %w", SandboxAddr, err)
	}
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, 1)
	rtAttrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.RTA_OIF, Data: oif},
		{Type: unix.RTA_PREFSRC, Data: src[:]},
	})
	if err != nil {
		return err
	}
	rtm := make([]byte, unix.SizeofRtMsg)
	rtm[0] = unix.AF_INET
	rtm[4], rtm[5], rtm[6], rtm[7] = unix.RT_TABLE_MAIN, unix.RTPROT_STATIC, unix.RT_SCOPE_LINK, unix.RTN_UNICAST
	if err := request(c, unix.RTM_NEWROUTE, append(rtm, rtAttrs...)); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

func request(c *netlink.Conn, typ netlink.HeaderType, data []byte) error {
	_, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: typ, Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Excl},
		Data:   data,
	})
	if err != nil {
		if oe, ok := err.(*netlink.OpError); ok && oe.Err == unix.EEXIST {
			return nil
		}
		return err
	}
	return nil
}

// redirectRules (re)writes the namespace's nftables table: the NAT
// redirects and the drop of everything else bound off the loopback.
func redirectRules(nsFD int) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: nftTable}
	// A resume's table is rewritten whole. A new sandbox has none, and
	// asking costs a dump (~0.1 ms), where a batch that deletes a table
	// (even none: the batch fails) costs 5 to 15 ms on a loaded host,
	// which was most of an egress session's create (bench row 11d).
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == nftTable }) {
		c.DelTable(tbl)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("delete the old nftables table: %w", err)
		}
	}
	c.AddTable(tbl)
	nat := c.AddChain(&nftables.Chain{Name: "nat_out", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	filter := c.AddChain(&nftables.Chain{Name: "filter_out", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	src := SandboxAddr.As4()
	loopback := append(daddrIn([]byte{127, 0, 0, 0}, []byte{255, 0, 0, 0}), accept())
	// nat: the loopback stays; DNS to the resolver; all other TCP to the
	// transparent listener.
	c.AddRule(&nftables.Rule{Table: tbl, Chain: nat, Exprs: loopback})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: nat, Exprs: append(append(l4(proto), dport(53)...), redir(53)...)})
	}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: nat, Exprs: append(l4(unix.IPPROTO_TCP), redir(3129)...)})
	// filter: the loopback, answers to the sandbox's own address and TCP
	// (all of it redirected) pass; the rest is dropped.
	c.AddRule(&nftables.Rule{Table: tbl, Chain: filter, Exprs: loopback})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: filter, Exprs: append(daddrIn(src[:], []byte{255, 255, 255, 255}), accept())})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: filter, Exprs: append(l4(unix.IPPROTO_TCP), accept())})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: filter, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	return c.Flush()
}

func daddrIn(addr, mask []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func redir(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
