package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// --- rows 9e and 9f: transparent egress (sandgate only) ---------------------
//
// 9e cfg.size over HTTP from row 9's loopback server, curl in a session
//    with no proxy at all (`--noproxy '*'`: the sandbox's resolver, the
//    namespace's redirect, the gateway's transparent listener, a spliced
//    tunnel) vs the same curl through the explicit proxy (`-p`: CONNECT),
//    rotating. Target: transparent >= 0.9x the proxy's MB/s.
// 9f the first DNS answer for a name: a UDP A query for a new name below
//    *.big.test to the sandbox's resolver (the gateway, in the namespace),
//    timed in the sandbox by a Python client, vs the same client on the
//    host against sgbench's own minimal responder on loopback (the floor
//    of a DNS round trip here). Added = the difference of the medians.
//    Target: <= 1 ms.

// dnsClientPy sends argv[3] A queries for fresh names below argv[4] to
// argv[1]:argv[2] over UDP, one at a time, and prints each round trip in
// nanoseconds; a query with no A answer is an error.
const dnsClientPy = `
import os, socket, struct, sys, time
host, port, n, suffix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
tag = os.urandom(4).hex()
out = []
for i in range(n):
    name = "q%d-%s.%s" % (i, tag, suffix)
    qid = i & 0xffff
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    t0 = time.perf_counter_ns()
    s.sendto(q, (host, port))
    while True:
        a = s.recv(512)
        if struct.unpack(">H", a[:2])[0] == qid:
            break
    t1 = time.perf_counter_ns()
    if struct.unpack(">H", a[6:8])[0] < 1:
        sys.exit("no answer for %s (rcode %d)" % (name, a[3] & 15))
    out.append(str(t1 - t0))
print(" ".join(out))
`

// dnsResponder answers every query on 127.0.0.1 with one A record,
// 198.18.0.2: the least a resolver can do, for 9f's reference.
type dnsResponder struct{ pc net.PacketConn }

func newDNSResponder() (*dnsResponder, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &dnsResponder{pc: pc}
	go d.serve()
	return d, nil
}

func (d *dnsResponder) port() int { return d.pc.LocalAddr().(*net.UDPAddr).Port }

func (d *dnsResponder) close() { _ = d.pc.Close() }

func (d *dnsResponder) serve() {
	buf := make([]byte, 512)
	for {
		n, addr, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if a := dnsAnswer(buf[:n]); a != nil {
			_, _ = d.pc.WriteTo(a, addr)
		}
	}
}

// dnsAnswer is the reply to query q with one A record (nil: not a query
// with one question).
func dnsAnswer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil
	}
	end := 12
	for end < len(q) && q[end] != 0 {
		end += int(q[end]) + 1
	}
	end += 5 // the root label, QTYPE, QCLASS
	if end > len(q) {
		return nil
	}
	a := append([]byte(nil), q[:end]...)
	a[2] |= 0x80                            // QR
	a[3] = 0x80                             // RA, NOERROR
	binary.BigEndian.PutUint16(a[6:8], 1)   // ANCOUNT
	binary.BigEndian.PutUint16(a[8:10], 0)  // NSCOUNT
	binary.BigEndian.PutUint16(a[10:12], 0) // ARCOUNT
	a = append(a, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 198, 18, 0, 2)
	return a
}

// parseNanos turns the client's "ns ns ..." into seconds.
func parseNanos(out []byte) ([]float64, error) {
	var xs []float64
	for _, f := range strings.Fields(string(out)) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("dns client printed %q", out)
		}
		xs = append(xs, float64(v)/1e9)
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("dns client printed nothing")
	}
	return xs, nil
}

// dnsQueries is 9f's queries per side (after 20 of warm-up each).
const dnsQueries = 400

// rowTransparent runs 9e and 9f on row 9's gateway and server.
func (b *bench) rowTransparent(g *sandgate, srv *blobServer, allow string) error {
	wild := fmt.Sprintf("*.%s:%d", egressName, srv.port())
	s, err := g.createWith(b.ctx, map[string]any{"egress": []string{allow, wild}})
	if err != nil {
		return err
	}
	defer g.delete(s.ID)
	c, err := g.sshClient(s)
	if err != nil {
		return err
	}
	defer c.Close()
	inSession := func(cmd string) ([]byte, error) {
		ss, err := c.NewSession()
		if err != nil {
			return nil, fmt.Errorf("new session: %w", err)
		}
		defer ss.Close()
		var errBuf bytes.Buffer
		ss.Stderr = &errBuf
		out, err := ss.Output(cmd)
		if err != nil {
			return nil, fmt.Errorf("in the session: %s: %v: %s", cmd, err, strings.TrimSpace(errBuf.String()))
		}
		return out, nil
	}
	r := b.report
	if b.cfg.wantRow("9e") {
		url := fmt.Sprintf("http://%s/big", allow)
		curl := func(extra ...string) func() (float64, error) {
			cmd := "curl"
			for _, a := range curlArgs(append(extra, url)...) {
				cmd += " " + shellQuote(a)
			}
			return func() (float64, error) {
				out, err := inSession(cmd)
				if err != nil {
					return 0, err
				}
				return parseCurl(out, b.cfg.size)
			}
		}
		variants := []struct {
			key string
			run func() (float64, error)
		}{{"transparent", curl("--noproxy", "*")}, {"proxy", curl("-p", "-x", "http://127.0.0.1:3128")}}
		got, cpu := map[string][]float64{}, map[string][]float64{}
		for _, v := range variants { // warm-up
			if _, err := v.run(); err != nil {
				return fmt.Errorf("9e %s: %w", v.key, err)
			}
		}
		for i := 0; i < b.cfg.reps; i++ {
			for j := range variants {
				v := variants[(i+j)%len(variants)]
				c0 := ownCPU(g.pid())
				x, err := v.run()
				if err != nil {
					return fmt.Errorf("9e %s: %w", v.key, err)
				}
				got[v.key] = append(got[v.key], x)
				cpu[v.key] = append(cpu[v.key], ownCPU(g.pid())-c0)
			}
		}
		perGiB := func(k string) float64 { return NewStats(cpu[k]).Median / (float64(b.cfg.size) / (1 << 30)) }
		tr, px := NewStats(got["transparent"]), NewStats(got["proxy"])
		r.add(&Row{ID: "9e", Name: b.sizeName() + " over HTTP from a loopback server: transparent egress vs the explicit proxy", Stat: "median", Unit: "s",
			SG: tr, Ref: px, Bytes: b.cfg.size, RefKind: "proxy",
			SGName:  "curl in a session with no proxy (`--noproxy '*'`): the sandbox's resolver, nftables redirect, spliced tunnel",
			RefName: "curl in the same session through the explicit proxy (`-p`: CONNECT, spliced tunnel)",
			Note: fmt.Sprintf("sandgate only; MB/s transparent/proxy = %.2f (target >= 0.9); gateway CPU per GiB %.2f s transparent, %.2f s proxy (less sensitive to the machine's load than the times)",
				px.Median/tr.Median, perGiB("transparent"), perGiB("proxy"))})
	}
	if b.cfg.wantRow("9f") {
		py, err := exec.LookPath("python3")
		if err != nil {
			r.add(&Row{ID: "9f", Name: "first DNS answer", Skipped: "python3 not installed"})
			return nil
		}
		resp, err := newDNSResponder()
		if err != nil {
			return err
		}
		defer resp.close()
		script := shellQuote(dnsClientPy)
		suffix := egressName
		sandbox := func(n int) ([]float64, error) {
			out, err := inSession(fmt.Sprintf("python3 -c %s 127.0.0.1 53 %d %s", script, n, suffix))
			if err != nil {
				return nil, err
			}
			return parseNanos(out)
		}
		host := func(n int) ([]float64, error) {
			ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, py, "-c", dnsClientPy, "127.0.0.1", strconv.Itoa(resp.port()), strconv.Itoa(n), suffix).Output()
			if err != nil {
				return nil, fmt.Errorf("dns client on the host: %w", err)
			}
			return parseNanos(out)
		}
		for _, f := range []func(int) ([]float64, error){sandbox, host} { // warm-up
			if _, err := f(20); err != nil {
				return fmt.Errorf("9f: %w", err)
			}
		}
		var sg, ref []float64
		for i := 0; i < 4; i++ { // alternating batches
			for j, f := range []func(int) ([]float64, error){sandbox, host} {
				if i%2 == 1 {
					f = []func(int) ([]float64, error){host, sandbox}[j]
				}
				xs, err := f(dnsQueries / 4)
				if err != nil {
					return fmt.Errorf("9f: %w", err)
				}
				if (i%2 == 0) == (j == 0) {
					sg = append(sg, xs...)
				} else {
					ref = append(ref, xs...)
				}
			}
		}
		sgS, refS := NewStats(sg), NewStats(ref)
		us := func(x float64) string { return fmt.Sprintf("%.0f µs", x*1e6) }
		for _, stat := range []string{"p50", "p99"} {
			a, c := sgS.Median, refS.Median
			if stat == "p99" {
				a, c = sgS.P99, refS.P99
			}
			r.add(&Row{ID: "9f", Name: "first DNS answer for a new allowed name (UDP A query, a Python client)", Stat: stat, Unit: "s",
				SG: sgS, Ref: refS, RefKind: "host",
				SGName:  "in a session: the sandbox's resolver (the gateway, in the namespace), a new name below *.big.test each query",
				RefName: "on the host: sgbench's minimal UDP responder on loopback (one A record), the floor of a DNS round trip",
				Note:    fmt.Sprintf("sandgate only; added %s: %s (target <= 1 ms)", stat, us(a-c))})
		}
	}
	return nil
}
