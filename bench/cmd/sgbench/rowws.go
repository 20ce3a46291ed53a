package main

import (
	"fmt"
	"time"
)

// --- e6: SSH over WebSocket -----------------------------------------------------

// wsHost is sandgate reached with `ProxyCommand sandgate proxy --transport
// websocket %h` (GET /v1/sessions/{id}/ssh upgraded to a WebSocket), the
// equal-footing cipher forced as on every e-row host.
const wsHost = "sg-eq-ws"

// wsLabel and connectLabel describe the two transports of sandgate's copying
// proxy in row e6's report.
const (
	wsLabel      = "`ProxyCommand sandgate proxy --transport websocket %h`"
	connectLabel = "`ProxyCommand sandgate proxy --transport connect %h` (the copying proxy, as e1b/e4c/e4d)"
)

// e6Hosts are the three ways row e6 rotates through: the WebSocket
// transport, the CONNECT transport (same proxy binary, same copying relay),
// and sshd behind the same hop (`sgbench nc`, the relay of `sandgate proxy`).
var e6Hosts = []string{wsHost, "sg-eq-stdio", hopHost}

// rotate runs f on every host n times, rotating the hosts' order each
// round so that none always goes first: seconds by host.
func rotate(hosts []string, n int, f func(h string) (float64, error)) (map[string][]float64, error) {
	samples := map[string][]float64{}
	for i := 0; i < n; i++ {
		for j := range hosts {
			h := hosts[(i+j)%len(hosts)]
			s, err := f(h)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", h, err)
			}
			samples[h] = append(samples[h], s)
		}
	}
	return samples, nil
}

// e6Rows adds the two ratios of one e6 workload: WebSocket over CONNECT
// (ids[0]) and WebSocket over sshd behind the same hop (ids[1]).
func (b *bench) e6Rows(ids [2]string, name, stat string, bytes int64, samples map[string][]float64, note func(ref string) string) {
	b.report.add(&Row{ID: ids[0], Name: name + " (WebSocket vs CONNECT)", Stat: stat, Unit: "s", Bytes: bytes,
		SG: NewStats(samples[wsHost]), Ref: NewStats(samples["sg-eq-stdio"]), SGName: wsLabel,
		RefKind: "sandgate CONNECT", RefName: connectLabel, Note: note("sg-eq-stdio")})
	b.report.add(&Row{ID: ids[1], Name: name + " (WebSocket; sshd behind the same hop)", Stat: stat, Unit: "s", Bytes: bytes,
		SG: NewStats(samples[wsHost]), Ref: NewStats(samples[hopHost]), SGName: wsLabel,
		RefName: hopRefName, Note: note(hopHost)})
}

// rowEqWebSocket is e6: sandgate's SSH-over-WebSocket transport against its
// CONNECT transport and against sshd behind the same hop, at equal footing
// (e-row cipher, TCP_NODELAY shim, one filesystem, sync before transfers):
// e6a/b new connection + `true`, e6c/d up and e6e/f down an exec channel.
func (b *bench) rowEqWebSocket() error {
	if !b.ws {
		b.report.add(&Row{ID: "e6", Name: "SSH over WebSocket", Skipped: b.cfg.sandgateBin + " proxy has no --transport websocket"})
		return nil
	}
	lbl := b.eqLabel()
	// e6a/b: new connection + exec true, after one warm-up each.
	conn, err := b.newConnSamples(e6Hosts)
	if err != nil {
		return err
	}
	b.e6Rows([2]string{"e6a", "e6b"}, "new connection + `true` (ssh)", "median", 0, conn,
		func(string) string {
			return fmt.Sprintf("%s; %d runs per way, the three ways rotating", lbl, b.cfg.newConnN)
		})

	local, err := b.makeBigFile()
	if err != nil {
		return err
	}
	// The downloads need the file on both servers (sg-eq-ws and
	// sg-eq-stdio share the session).
	for _, h := range []string{"sg-eq-stdio", hopHost} {
		if _, err := b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > "+b.remote(h)); err != nil {
			return err
		}
	}
	size := b.sizeName()
	for _, w := range []struct {
		ids  [2]string
		name string
		run  func(h string) (time.Duration, error)
	}{
		{[2]string{"e6c", "e6d"}, size + " up an exec channel: `cat > /dev/null`", func(h string) (time.Duration, error) {
			return b.runClient(local, "", "ssh", "-F", b.sshCfg, h, "cat > /dev/null")
		}},
		{[2]string{"e6e", "e6f"}, size + " down an exec channel: `cat file`", func(h string) (time.Duration, error) {
			return b.runClient("", "", "ssh", "-F", b.sshCfg, h, "cat "+b.remote(h))
		}},
	} {
		srv, cli := map[string][]float64{}, map[string][]float64{}
		samples, err := rotate(e6Hosts, b.cfg.reps, func(h string) (float64, error) {
			b.eqSync()
			pid := b.serverPID(h)
			before := pidSet(descendants(pid))
			c0 := treeCPU(pid)
			d, err := w.run(h)
			client := b.lastClientCPU
			settle(pid, before, 2*time.Second)
			srv[h] = append(srv[h], treeCPU(pid)-c0)
			cli[h] = append(cli[h], client)
			return d.Seconds(), err
		})
		if err != nil {
			return err
		}
		med := func(xs []float64) float64 { return NewStats(xs).Median }
		b.e6Rows(w.ids, w.name, "median", b.cfg.size, samples, func(ref string) string {
			return fmt.Sprintf("%s; %d runs per way, the three ways rotating, `sync` before each; CPU s per run, server / client side (client: ssh, and its ProxyCommand only when that ends first and ssh reaps it): WebSocket %.2f / %.2f, reference %.2f / %.2f",
				lbl, b.cfg.reps, med(srv[wsHost]), med(cli[wsHost]), med(srv[ref]), med(cli[ref]))
		})
	}
	return nil
}
