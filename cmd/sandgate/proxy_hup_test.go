package main

import (
	"bufio"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The end of a tunnel as OpenSSH makes it: ssh writes its last packets
// to the proxy's stdin, closes its pipes and at once sends the proxy
// SIGHUP (ssh_kill_proxy_command). The proxy still relays those packets,
// ends the tunnel with a half-close, takes the gateway's last bytes, and
// exits 0 with nothing on stderr: the gateway reads an EOF, not a reset.
// (Killed by the signal, the proxy dropped ssh's last packets, and its
// socket answered the gateway's last bytes with a reset.)
func TestProxyHangupEndsTheTunnel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	hupSent, connected := make(chan struct{}), make(chan struct{})
	type result struct {
		got     string
		err     error
		writeTo error
	}
	gw := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			gw <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				gw <- result{err: err}
				return
			}
			if line == "\r\n" {
				break
			}
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
			gw <- result{err: err}
			return
		}
		close(connected)
		// ssh's last packets, up to the proxy's half-close.
		b, err := io.ReadAll(br)
		// The gateway's last bytes go out once ssh has hung up.
		<-hupSent
		_, werr := io.WriteString(c, "gateway's last words")
		gw <- result{got: string(b), err: err, writeTo: werr}
	}()

	cmd := exec.Command(sandgateBin, "proxy", "--api-url", "http://"+ln.Addr().String(), "--transport", "connect", "sbx-hup")
	cmd.Env = cleanEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	// Once the tunnel is up: ssh's last packets, its pipes closed,
	// SIGHUP, as ssh's exit does it.
	select {
	case <-connected:
	case r := <-gw:
		t.Fatalf("the gateway: %v", r.err)
	}
	if _, err := io.WriteString(stdin, "channel close, disconnect"); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	close(hupSent)
	out, _ := io.ReadAll(stdout)
	werr := cmd.Wait()
	r := <-gw
	if r.err != nil || r.got != "channel close, disconnect" {
		t.Errorf("the gateway read %q, %v; want ssh's last packets, then EOF", r.got, r.err)
	}
	if werr != nil || stderr.String() != "" {
		t.Errorf("the proxy ended with %v, stderr %q; want exit 0 and nothing", werr, stderr.String())
	}
	if r.writeTo == nil && string(out) != "gateway's last words" {
		t.Errorf("ssh's pipe got %q, want the gateway's last bytes", out)
	}
}
