package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// The transparent egress: the sandbox's network sends every TCP connection
// to a listener served by ServeTransparent, and its DNS to ServeDNS. The
// resolver answers a name the policy allows with an address of NamePrefix
// that stands for the name in this session; a connection to that address
// is checked and dialled by name, as a CONNECT to name:port is. A name
// outside the policy gets NXDOMAIN, logged as a denial; a connection to
// an IP literal is checked as a CONNECT to that literal.

// dnsTTL is the TTL of the resolver's answers; an address keeps its name
// for the session's life anyway.
const dnsTTL = 60

// ServeTransparent serves ln, whose connections are redirected ones
// (their original destination read with SO_ORIGINAL_DST), until ln or the
// session is closed; it returns nil then.
func (s *Session) ServeTransparent(ln net.Listener) error {
	if !s.track(ln) {
		return nil
	}
	defer s.untrack(ln)
	ll := &limitListener{Listener: ln, s: s}
	for {
		c, err := ll.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !s.goTracked(func() { s.handleTransparent(c) }) {
			c.Close()
			return nil
		}
	}
}

// refuse ends a refused connection with a reset, as a closed port would.
func refuse(c net.Conn) {
	if tc, ok := rawConn(c).(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (s *Session) handleTransparent(c net.Conn) {
	rec := newRecord("tcp")
	defer s.logRecord(rec)
	dst, err := originalDst(rawConn(c))
	if err != nil {
		rec.deny("no original destination: " + err.Error())
		refuse(c)
		return
	}
	a, port := dst.Addr().Unmap(), dst.Port()
	host := a.String()
	if name, ok := s.names.nameAt(a); ok {
		host = name
	} else if NamePrefix.Contains(a) {
		rec.setTarget(host, port)
		rec.deny("address not given by this session's resolver")
		refuse(c)
		return
	}
	rec.setTarget(host, port)
	// The waits and the dial end with the session.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	pol := s.pol.Load()
	approved := false
	if !pol.Allow.Allows(host, port) {
		// A parked transparent connection is not read meanwhile (its
		// first bytes wait in the socket); one its client closes or
		// resets is let go at once (whilePeerOpen).
		askCtx, stopWatch := whilePeerOpen(ctx, c)
		d := s.ask(askCtx, pol, host, port, "transparent", "")
		stopWatch()
		if d != nil {
			rec.deny(d.Reason)
			refuse(c)
			return
		}
		pol, approved = s.pol.Load(), true
	}
	intercept := len(pol.bound(host, port)) > 0
	if intercept && s.ca == nil {
		rec.deny("secrets are bound to this host but the session has no CA")
		refuse(c)
		return
	}
	var buffered []byte
	if !intercept && pol.Allow.OnlyRules(host, port) {
		// Plain HTTP is read request by request; TLS is intercepted with
		// the session's CA, if it has one, and its requests read there.
		hello, err := peekHello(c, nil, s.p.cfg.HeaderTimeout)
		if err != nil || !hello.tls || s.ca == nil {
			s.serveRules(c, rec, host, port, hello, err)
			return
		}
		intercept, buffered = true, hello.replay
	}
	up, ip, err := s.dialCounted(ctx, host, port)
	cancel()
	rec.setIP(ip)
	if err != nil {
		var d *denial
		if !errors.As(err, &d) {
			d = denied(http.StatusBadGateway, "%v", err)
		}
		rec.deny(d.Reason)
		refuse(c)
		return
	}
	rec.allow()
	t := &tunnel{s: s, rec: rec, pol: pol, host: host, port: port, ip: ip, client: c, up: up, buffered: buffered, transparent: true, approved: approved}
	if intercept {
		s.intercept(t)
	} else {
		s.splice(t)
	}
}

// peerPoll is how often a parked transparent connection is looked at for
// its client leaving (whilePeerOpen).
const peerPoll = 500 * time.Millisecond

// whilePeerOpen returns a context that ends with ctx, or as soon as c's
// peer has closed or reset the connection (peerClosed, polled every
// peerPoll), and its stop, which ends the poll and waits for it. A client
// that only half-closes (shutdown(SHUT_WR), as nc -N does) while it waits
// looks the same as one that left, and is let go too.
func whilePeerOpen(ctx context.Context, c net.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(peerPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if peerClosed(c) {
					cancel()
					return
				}
			}
		}
	}()
	return ctx, func() {
		cancel()
		<-done
	}
}

// serveRules serves a transparent connection to a host:port only rules
// per request allow, whose first bytes peekHello read (hello, err): plain
// HTTP is served request by request (servePlainConn); anything else (TLS
// without the session's CA) is refused, as the rules could not be read.
func (s *Session) serveRules(c net.Conn, rec *record, host string, port uint16, hello hello, err error) {
	switch {
	case err != nil:
		rec.deny(err.Error())
		refuse(c)
		return
	case hello.tls || hello.eof:
		rec.deny(errRulesUnread)
		refuse(c)
		return
	}
	defer c.Close()
	rec.allow()
	s.servePlainConn(c, hello.replay, host, port, false)
}

// servePlainConn serves a transparent connection's plain HTTP, replay
// (bytes read from c already) first, until the client's connection ends:
// every request on it (keep-alive) is held to its Host (the resolved name
// or, for an IP literal, an allowed one), to the rules per request (unless
// the connection was approved in ask mode and no entry names its host),
// and to the tripwire, and forwarded as an absolute-URI http:// request
// through the proxy is (forwardPlain), each request a decision of its own.
func (s *Session) servePlainConn(c net.Conn, replay []byte, host string, port uint16, approved bool) {
	target := hostPort(host, port)
	_, literalErr := netip.ParseAddr(host)
	literal := literalErr == nil
	ln := newOneConnListener(&replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(replay), c)})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !s.enter() {
				writeLine(w, http.StatusServiceUnavailable, "session closed")
				return
			}
			defer s.wg.Done()
			rq := newRecord("http")
			defer s.logRecord(rq)
			rq.setTarget(host, port)
			if r.Method == http.MethodConnect {
				rq.deny("CONNECT on a transparent connection")
				writeLine(w, http.StatusMethodNotAllowed, target+" denied: CONNECT is not proxied on a connection that is not to the proxy")
				return
			}
			pol := s.pol.Load()
			if reason := plainHostReason(pol, r.Host, host, port, literal); reason != "" {
				rq.deny(reason)
				writeLine(w, http.StatusForbidden, target+" denied: "+reason)
				return
			}
			if ok, rule := pol.Allow.AllowsRequest(host, port, r.Method, r.URL.Path); !ok && !(approved && rule == "") {
				if rule == "" {
					rq.deny("not in this session's egress list")
					writeLine(w, http.StatusForbidden, target+" denied: not in this session's egress list")
					return
				}
				rq.deny("refused by the rule " + rule)
				writeLine(w, http.StatusForbidden, fmt.Sprintf("%s %s%s denied by the rule %s", r.Method, target, r.URL.EscapedPath(), rule))
				return
			}
			s.forwardPlain(w, r, rq, pol, host, port)
		}),
		ReadHeaderTimeout: s.p.cfg.HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    s.p.cfg.MaxHeaderBytes,
		ErrorLog:          s.srv.ErrorLog,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, clientConnKey{}, c)
		},
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	srv.Serve(ln) // until the client's connection ends
}

// plainHostReason holds a transparent plain HTTP request's Host to the
// connection's host: the resolved name itself, or, for a connection to
// an IP literal, a name the list allows on port (or an IP). "" when fine.
func plainHostReason(pol *Policy, hostHdr, host string, port uint16, literal bool) string {
	if literal {
		name, _, _ := strings.Cut(hostHdr, ":")
		if h, _, err := net.SplitHostPort(hostHdr); err == nil {
			name = h
		}
		if n, ip, ok := normalizeHost(name); ok && !ip.IsValid() && !pol.Allow.Allows(n, port) {
			return fmt.Sprintf("Host %s is not in this session's egress list", n)
		}
		return ""
	}
	if !hostMatches(hostHdr, host, port) {
		// The Host as far as a hostname goes: the reason is logged,
		// audited and kept among the session's decisions.
		return fmt.Sprintf("Host %.255q does not match the resolved name %s", hostHdr, host)
	}
	return ""
}

// httpMethods are the request methods whose request line readMethod
// recognizes.
var httpMethods = []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT ",
	"PROPFIND ", "PROPPATCH ", "MKCOL ", "COPY ", "MOVE ", "LOCK ", "UNLOCK ", "REPORT ", "SEARCH ", "PURGE ", "QUERY "}

// readMethod reads on from a transparent connection's first bytes while
// they may still begin an HTTP request line (within HeaderTimeout). It
// returns every byte read, to be sent on, and whether they begin one.
func (s *Session) readMethod(c net.Conn, first []byte) ([]byte, bool, error) {
	buf := append([]byte(nil), first...)
	c.SetReadDeadline(time.Now().Add(s.p.cfg.HeaderTimeout))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	for {
		// Empty lines before the request line are skipped, as servers do.
		r := bytes.TrimLeft(buf, "\r\n")
		prefix := len(r) == 0
		for _, m := range httpMethods {
			if len(r) >= len(m) && string(r[:len(m)]) == m {
				return buf, true, nil
			}
			if len(r) < len(m) && m[:len(r)] == string(r) {
				prefix = true
			}
		}
		if !prefix {
			return buf, false, nil
		}
		n, err := c.Read(b[:])
		buf = append(buf, b[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return buf, false, nil
			}
			return buf, false, fmt.Errorf("reading the client's first bytes: %w", unwrapOpError(err))
		}
	}
}

// ServeDNS serves the sandbox's resolver on pc (UDP) and ln (TCP) until
// they or the session are closed; it returns nil then.
func (s *Session) ServeDNS(pc net.PacketConn, ln net.Listener) error {
	h := dns.HandlerFunc(s.answerDNS)
	udp := &dns.Server{PacketConn: pc, Handler: h}
	// The resolver's TCP connections count against the session's
	// connection bounds (per session, tenant, gateway) as the proxy's do:
	// each holds a descriptor of the gateway.
	tcp := &dns.Server{Listener: &limitListener{Listener: ln, s: s}, Handler: h, ReadTimeout: s.p.cfg.HeaderTimeout, WriteTimeout: s.p.cfg.HeaderTimeout,
		MaxTCPQueries: 128}
	// Closing the session shuts both down, with their TCP connections.
	stop := &closer{close: func() {
		_ = udp.Shutdown()
		_ = tcp.Shutdown()
		pc.Close()
		ln.Close()
	}}
	if !s.track(stop) {
		return nil
	}
	defer s.untrack(stop)
	errs := make(chan error, 2)
	go func() { errs <- udp.ActivateAndServe() }()
	go func() { errs <- tcp.ActivateAndServe() }()
	var first error
	for range 2 {
		err := <-errs
		// Either ending ends both.
		pc.Close()
		ln.Close()
		if err != nil && first == nil && !errors.Is(err, net.ErrClosed) {
			first = err
		}
	}
	select {
	case <-s.done:
		return nil
	default:
		return first
	}
}

// closer is a func as an io.Closer (a pointer: the session's set of
// closers is a map).
type closer struct{ close func() }

func (c *closer) Close() error {
	c.close()
	return nil
}

// RefusedNamesLoggedPerSecond paces the refused names (NXDOMAIN) the log
// and the audit log record, per tenant (after a burst of as many): a
// sandbox can ask names far faster than that. The ones past the pace are
// counted, and the next one recorded says how many were left out.
const RefusedNamesLoggedPerSecond = 8

// logRefusedName records a refused name (NXDOMAIN, or SERVFAIL past
// MaxNames), within the tenant's pace of them.
func (s *Session) logRefusedName(name, reason string) {
	if !s.p.namePace.take(s.tenant, time.Now()) {
		s.unlogged.Add(1)
		return
	}
	if n := s.unlogged.Swap(0); n > 0 {
		reason = fmt.Sprintf("%s (and %d more refused names not recorded: past %d a second)", reason, n, RefusedNamesLoggedPerSecond)
	}
	rec := newRecord("dns")
	rec.setTarget(name, 0)
	rec.deny(reason)
	s.logRecord(rec)
}

// addrFor is name's address in this session, a new name counted against
// the tenant's and the gateway's bounds of names.
func (s *Session) addrFor(name string) (netip.Addr, error) {
	return s.names.addrFor(name, func() error { return s.p.nameCount.take(s.tenant) })
}

// answerDNS answers one query: an allowed name's A record is its address
// of NamePrefix; its other records are empty; a name outside the policy
// is NXDOMAIN, its A query logged as a denial.
func (s *Session) answerDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	defer w.WriteMsg(m)
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		if r.Opcode != dns.OpcodeQuery {
			m.Rcode = dns.RcodeNotImplemented
		}
		return
	}
	q := r.Question[0]
	name, ip, ok := normalizeHost(strings.TrimSuffix(q.Name, "."))
	if ok && ip.IsValid() {
		ok = false
	}
	pol := s.pol.Load()
	// In ask mode a name the operator's ceiling allows resolves as well
	// (to an address of its own, as any): its connections are parked
	// for approval, and refused at connect when denied.
	if !ok || !pol.Allow.AllowsName(name) && !(pol.Ask && pol.AskWithin.AllowsName(name)) {
		m.Rcode = dns.RcodeNameError
		// One denial a lookup: resolvers ask A and AAAA together.
		if q.Qtype == dns.TypeA {
			s.logRefusedName(strings.TrimSuffix(q.Name, "."), "not in this session's egress list")
		}
		return
	}
	if q.Qtype != dns.TypeA || q.Qclass != dns.ClassINET {
		return // NOERROR, no records: the name is reached over IPv4
	}
	a, err := s.addrFor(name)
	if err != nil {
		m.Rcode = dns.RcodeServerFailure
		s.logRefusedName(name, err.Error())
		return
	}
	m.Answer = append(m.Answer, &dns.A{
		Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
		A:   net.IP(a.AsSlice()),
	})
}
