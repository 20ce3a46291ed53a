//go:build linux

package linuxns_test

import (
	"bufio"
	"context"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// Transparent egress: a TCP connection to any address off the loopback
// reaches the TCP listener, DNS to any server the resolver's, other UDP
// fails at once, and the loopback is the sandbox's own still; setting it up
// twice (a resume) is fine; the sandbox's resolv.conf names the resolver.
func TestLinuxTransparentNet(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-transparent"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	tn := sb.(sandbox.TransparentNet)
	first, err := tn.ListenTransparent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first.TCP.Close()
	first.DNSTCP.Close()
	first.DNSUDP.Close()
	tr, err := tn.ListenTransparent(ctx)
	if err != nil {
		t.Fatalf("again: %v", err)
	}
	defer tr.TCP.Close()
	defer tr.DNSTCP.Close()
	defer tr.DNSUDP.Close()
	// The second setup rewrote the table whole: its rules are there once.
	if n, err := linuxns.NftRules(sb); err != nil || n["nat_out"] != 4 || n["filter_out"] != 4 {
		t.Errorf("nftables rules after two setups: %v %v, want 4 in each chain", n, err)
	}
	if tr.Source.String() != "198.18.0.1" {
		t.Errorf("source %v", tr.Source)
	}
	go func() {
		for {
			c, err := tr.TCP.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			_, _ = c.Write([]byte("got " + line))
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := tr.DNSUDP.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = tr.DNSUDP.WriteTo(append([]byte("dns:"), buf[:n]...), from)
		}
	}()
	for _, c := range []struct{ name, cmd, want string }{
		{"tcp to a public address", `exec 3<>/dev/tcp/203.0.113.7/443 && echo hello >&3 && head -n1 <&3 || echo unreachable`, "got hello\n"},
		{"tcp to a private address", `exec 3<>/dev/tcp/10.1.2.3/5432 && echo pg >&3 && head -n1 <&3 || echo unreachable`, "got pg\n"},
		{"the loopback stays the sandbox's", `exec 3<>/dev/tcp/127.0.0.1/9 2>/dev/null && echo open || echo closed`, "closed\n"},
		{"dns to another server", `python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(10); s.sendto(b\"q\", (\"192.0.2.53\", 53)); print(s.recv(100).decode())"`, "dns:q\n"},
		{"other udp fails at once", `python3 -c "
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"x\", (\"192.0.2.1\", 443)); print(\"sent\")
except PermissionError:
    print(\"refused\")"`, "refused\n"},
		{"resolv.conf", `cat /etc/resolv.conf | head -n1`, "nameserver 127.0.0.1\n"},
	} {
		if out, errOut, _ := runIn(t, sb, "bash -c '"+c.cmd+"'"); out != c.want {
			t.Errorf("%s: %q %q, want %q", c.name, out, errOut, c.want)
		}
	}
}
