package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// ideServer stands in for the server an IDE installs and starts on the
// remote (VS Code's vscode-server, JetBrains' backend): it listens on
// 127.0.0.1:argv[1], says so on stdout, and echoes every connection.
const ideServer = `import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
print("listeningOn=%d" % s.getsockname()[1], flush=True)
def echo(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
`

// execOut runs cmd on c with stdin and returns its stdout.
func execOut(t *testing.T, c *gossh.Client, cmd, stdin string) string {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if stdin != "" {
		s.Stdin = strings.NewReader(stdin)
	}
	var stderr bytes.Buffer
	s.Stderr = &stderr
	out, err := s.Output(cmd)
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", cmd, err, stderr.String())
	}
	return string(out)
}

// TestIDERemoteSSH does over one SSH connection, through the real binary,
// what VS Code Remote-SSH and JetBrains Gateway do on a remote: probe the
// platform with exec (and a script on a shell's stdin), upload the server
// over SFTP under the home directory, start it with a long-running exec,
// then open several direct-tcpip channels at once to its port on the
// sandbox's loopback and exchange data on all of them, while more execs
// share the connection.
func TestIDERemoteSSH(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, forwardDriverArgs(t, driver)...)
			s := g.createSession(t)
			c := goSSH(t, g, s)

			// 1. Platform probes, as the IDEs' install scripts make them.
			if got := strings.TrimSpace(execOut(t, c, "uname -s", "")); got != "Linux" {
				t.Fatalf("uname -s: %q", got)
			}
			home := strings.TrimSpace(execOut(t, c, "echo $HOME", ""))
			if !strings.HasPrefix(home, "/") {
				t.Fatalf("echo $HOME: %q", home)
			}
			probe := "set -e\necho platform=$(uname -s | tr A-Z a-z)\necho arch=$(uname -m)\n" +
				"command -v python3 >/dev/null && echo python=yes\necho home=$HOME\n"
			out := execOut(t, c, "sh", probe) // the script on the shell's stdin, as VS Code sends it
			for _, want := range []string{"platform=linux\n", "arch=", "python=yes\n", "home=" + home + "\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("probe script: %q lacks %q", out, want)
				}
			}

			// 2. The server, uploaded over SFTP under ~/.vscode-server: a
			// path relative to where SFTP starts, the home directory.
			fc, err := sftp.NewClient(c)
			if err != nil {
				t.Fatal(err)
			}
			defer fc.Close()
			dir := path.Join(".vscode-server", "bin", "0123456789abcdef")
			if err := fc.MkdirAll(dir); err != nil {
				t.Fatalf("sftp mkdir -p %s: %v", dir, err)
			}
			server := path.Join(dir, "server.py")
			f, err := fc.Create(server + ".tmp")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write([]byte(ideServer)); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := fc.Chmod(server+".tmp", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := fc.PosixRename(server+".tmp", server); err != nil {
				t.Fatal(err)
			}
			if fi, err := fc.Stat(server); err != nil || fi.Size() != int64(len(ideServer)) || fi.Mode().Perm() != 0o755 {
				t.Fatalf("uploaded server: %v %v", fi, err)
			}
			if got := execOut(t, c, "wc -c < $HOME/"+server, ""); strings.TrimSpace(got) != fmt.Sprint(len(ideServer)) {
				t.Fatalf("exec sees the uploaded server as %q bytes", got)
			}
			if driver == "linux" {
				// The sandbox's own absolute paths work too (workdir's SFTP
				// root is the session's directory: "/" is $HOME there).
				if fi, err := fc.Stat(path.Join(home, server)); err != nil || fi.Size() != int64(len(ideServer)) {
					t.Fatalf("sftp stat of the absolute path: %v %v", fi, err)
				}
			}

			// 3. Started with a long-running exec that reports its port.
			port := gwtest.FreePort(t)
			srv, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			stdout, err := srv.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(fmt.Sprintf("exec python3 $HOME/%s %d", server, port)); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || line != fmt.Sprintf("listeningOn=%d\n", port) {
				t.Fatalf("server said %q, %v", line, err)
			}

			// 4. Several direct-tcpip channels at once, each with its own data.
			const channels, size = 8, 256 << 10
			var wg sync.WaitGroup
			errs := make(chan error, channels)
			for i := range channels {
				wg.Go(func() {
					host := "127.0.0.1"
					if i%2 == 1 {
						host = "localhost"
					}
					ch, err := directTCPIP(c, host, port)
					if err != nil {
						errs <- fmt.Errorf("channel %d: %w", i, err)
						return
					}
					defer ch.Close()
					data := make([]byte, size)
					_, _ = rand.Read(data)
					werr := make(chan error, 1)
					go func() {
						_, err := ch.Write(data)
						if err == nil {
							err = ch.CloseWrite()
						}
						werr <- err
					}()
					got, err := io.ReadAll(ch)
					if err := errors.Join(err, <-werr); err != nil {
						errs <- fmt.Errorf("channel %d: %w", i, err)
						return
					}
					if !bytes.Equal(got, data) {
						errs <- fmt.Errorf("channel %d: %d bytes back, not the %d sent", i, len(got), len(data))
					}
				})
			}
			// More execs share the connection meanwhile.
			if got := execOut(t, c, "echo still-here", ""); got != "still-here\n" {
				t.Errorf("exec beside the channels: %q", got)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}

			// 5. Ending the exec ends the server: its port closes.
			srv.Close()
			deadline := time.Now().Add(30 * time.Second)
			for {
				ch, err := directTCPIP(c, "127.0.0.1", port)
				if err != nil {
					var oce *gossh.OpenChannelError
					if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
						t.Errorf("after the server ended: %v, want connection failed", err)
					}
					break
				}
				ch.Close()
				if time.Now().After(deadline) {
					t.Fatal("the server still listens after its exec ended")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
