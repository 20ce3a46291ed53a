package sshd_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sshd"
)

func TestMain(m *testing.M) {
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

func TestExecExitCodesAndStreams(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	tests := []struct {
		name, cmd, stdout, stderr string
		code                      int
		signal                    string
	}{
		{"ok", "echo hello", "hello\n", "", 0, ""},
		{"exit code", "exit 42", "", "", 42, ""},
		{"stderr apart", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3, ""},
		{"not found", "no-such-command-xyz", "", "", 127, ""},
		{"killed", "kill -TERM $$", "", "", 143, "TERM"},
		{"cwd is workdir", "pwd", "", "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := gwtest.Exec(t, c, tt.cmd)
			if r.Code != tt.code || r.Signal != tt.signal {
				t.Fatalf("exit = %d/%q, want %d/%q (stderr %q)", r.Code, r.Signal, tt.code, tt.signal, r.Stderr)
			}
			if tt.name == "cwd is workdir" {
				if !strings.Contains(r.Stdout, id) {
					t.Fatalf("pwd = %q, want the session workdir", r.Stdout)
				}
				return
			}
			if tt.name == "not found" {
				if !strings.Contains(r.Stderr, "not found") {
					t.Fatalf("stderr = %q", r.Stderr)
				}
				return
			}
			if r.Stdout != tt.stdout || r.Stderr != tt.stderr {
				t.Fatalf("stdout %q stderr %q, want %q %q", r.Stdout, r.Stderr, tt.stdout, tt.stderr)
			}
		})
	}
}

func TestExecStdinAndLargeOutput(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	in := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	sess.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	sess.Stdout = &out
	if err := sess.Run("cat"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatalf("cat returned %d bytes, want %d identical", out.Len(), len(in))
	}
}

func TestEnvAllowList(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{SSH: sshd.Config{EnvAllow: []string{"MY_*"}}})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for k, wantOK := range map[string]bool{"LANG": true, "LC_ALL": true, "MY_VAR": true, "LD_PRELOAD": false, "PATH": false} {
		err := sess.Setenv(k, "x")
		if (err == nil) != wantOK {
			t.Errorf("setenv %s: err=%v, want ok=%v", k, err, wantOK)
		}
	}
	out, err := sess.Output("echo $LC_ALL/$MY_VAR/$LD_PRELOAD; echo $HOME")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if lines[0] != "x/x/" {
		t.Fatalf("env = %q", lines[0])
	}
	if os.Getenv("HOME") != "" && lines[1] == os.Getenv("HOME") {
		t.Fatalf("HOME leaked from the gateway: %q", lines[1])
	}
}

func TestPTYShellAndWindowChange(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm", 40, 100, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	var out gwtest.Buffer
	sess.Stdout = &out
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "stty size; tty; echo TERM=$TERM; [ \"$SSH_TTY\" = \"$(tty)\" ] && echo SSH_TTY-ok\n")
	waitFor(t, &out, "40 100")
	if err := sess.WindowChange(50, 132); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "stty size\n")
	waitFor(t, &out, "50 132")
	io.WriteString(stdin, "exit 7\n")
	err = sess.Wait()
	var ee *gossh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 7 {
		t.Fatalf("wait = %v, want exit 7; output %q", err, out.String())
	}
	for _, want := range []string{"/dev/pts/", "TERM=xterm", "SSH_TTY-ok"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output %q lacks %q", out.String(), want)
		}
	}
}

func TestSignalRequest(t *testing.T) {
	wantKilledBy(t, "echo started; sleep 30", "started", "INT", func(sess *gossh.Session) error {
		return sess.Signal(gossh.SIGINT)
	})
}

// TestEndOfWrite: eow@openssh.com (what OpenSSH's client sends to an
// OpenSSH server once its own output is closed: `ssh host yes | head`)
// closes the command's output, so the command dies of SIGPIPE.
func TestEndOfWrite(t *testing.T) {
	wantKilledBy(t, "yes", "y\n", "PIPE", func(sess *gossh.Session) error {
		_, err := sess.SendRequest("eow@openssh.com", false, nil)
		return err
	})
}

// wantKilledBy starts command, waits for ready in its output, then does
// act, which must end the command by signal sig (or a shell's 128+n for
// it) within 10 s.
func wantKilledBy(t *testing.T, command, ready, sig string, act func(*gossh.Session) error) {
	t.Helper()
	s := gwtest.Start(t, gwtest.Options{})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out gwtest.Buffer
	sess.Stdout = &out
	if err := sess.Start(command); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, ready)
	if err := act(sess); err != nil {
		t.Fatal(err)
	}
	num, ok := sandbox.ParseSignal(sig)
	if !ok {
		t.Fatalf("no signal %s", sig)
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err := <-done:
		var ee *gossh.ExitError
		if !errors.As(err, &ee) || (ee.Signal() != sig && ee.ExitStatus() != 128+int(num)) {
			t.Fatalf("wait = %v, want killed by %s", err, sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%q did not end the command", command)
	}
}

func TestChannelCloseKillsCommand(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var out gwtest.Buffer
	sess.Stdout = &out
	if err := sess.Start("echo $$; exec sleep 300"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, "\n")
	sess.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(gwtest.TaggedProcesses(id)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v survived the channel close", gwtest.TaggedProcesses(id))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBackgroundProcessOutlivesExec(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	start := time.Now()
	r := gwtest.Exec(t, c, "nohup sleep 300 >/dev/null 2>&1 & echo $!")
	if r.Code != 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("background start: %+v after %v", r, time.Since(start))
	}
	pid := strings.TrimSpace(r.Stdout)
	if r := gwtest.Exec(t, c, "kill -0 "+pid+" && echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("background process gone after its exec ended: %+v", r)
	}
	// A background job still holding stdout does not hang the exec forever.
	start = time.Now()
	gwtest.Exec(t, c, "sleep 300 &")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("exec with a background writer took %v", d)
	}
	if code := s.Do(t, s.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	if pids := gwtest.TaggedProcesses(id); len(pids) > 0 {
		t.Fatalf("processes %v survived DELETE", pids)
	}
}

func TestAuthMethods(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	sshPub, _ := gossh.NewPublicKey(pub)
	signer, _ := gossh.NewSignerFromKey(priv)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := gossh.NewSignerFromKey(otherPriv)
	authorized := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(sshPub)))

	t.Run("default accepts none, password and the session key", func(t *testing.T) {
		s := gwtest.Start(t, gwtest.Options{})
		sess := s.CreateSession(t, map[string]any{"sshPublicKey": authorized})
		if sess.SSH.Password == "" {
			t.Fatal("create response has no password")
		}
		s.SSH(t, sess.SessionID).Close()
		s.SSH(t, sess.SessionID, gossh.Password(sess.SSH.Password)).Close()
		s.SSH(t, sess.SessionID, gossh.PublicKeys(signer)).Close()
	})
	t.Run("password and key only", func(t *testing.T) {
		s := gwtest.Start(t, gwtest.Options{SSH: sshd.Config{AuthMethods: []string{"password", "publickey"}}})
		sess := s.CreateSession(t, map[string]any{"sshPublicKey": authorized})
		if _, err := s.SSHErr(t, sess.SessionID); err == nil {
			t.Fatal("none auth accepted although not allowed")
		}
		if _, err := s.SSHErr(t, sess.SessionID, gossh.Password("wrong")); err == nil {
			t.Fatal("wrong password accepted")
		}
		if _, err := s.SSHErr(t, sess.SessionID, gossh.PublicKeys(otherSigner)); err == nil {
			t.Fatal("foreign key accepted")
		}
		s.SSH(t, sess.SessionID, gossh.Password(sess.SSH.Password)).Close()
		s.SSH(t, sess.SessionID, gossh.PublicKeys(signer)).Close()
		// Another session's password does not open this one.
		other := s.CreateSession(t, nil)
		if _, err := s.SSHErr(t, sess.SessionID, gossh.Password(other.SSH.Password)); err == nil {
			t.Fatal("another session's password accepted")
		}
	})
	t.Run("auth tries are capped", func(t *testing.T) {
		s := gwtest.Start(t, gwtest.Options{SSH: sshd.Config{AuthMethods: []string{"password"}, MaxAuthTries: 3}})
		sess := s.CreateSession(t, nil)
		tries := 0
		_, err := s.SSHErr(t, sess.SessionID, gossh.RetryableAuthMethod(gossh.PasswordCallback(func() (string, error) {
			tries++
			return "wrong", nil
		}), 20))
		if err == nil || tries > 3 {
			t.Fatalf("err=%v after %d tries, want failure within 3", err, tries)
		}
	})
}

func TestForwardingRefused(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	if _, err := c.Dial("tcp", "127.0.0.1:22"); err == nil {
		t.Fatal("direct-tcpip accepted")
	}
	if _, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
		t.Fatal("tcpip-forward accepted")
	}
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	ok, err := sess.SendRequest("auth-agent-req@openssh.com", true, nil)
	if err != nil || ok {
		t.Fatalf("agent forwarding: ok=%v err=%v, want refused", ok, err)
	}
	ok, err = sess.SendRequest("x11-req", true, gossh.Marshal(struct {
		Single        bool
		Proto, Cookie string
		Screen        uint32
	}{false, "MIT-MAGIC-COOKIE-1", "00", 0}))
	if err != nil || ok {
		t.Fatalf("x11 forwarding: ok=%v err=%v, want refused", ok, err)
	}
}

func TestSFTPOperationsAndConfinement(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	fc := gwtest.SFTP(t, c)

	data := bytes.Repeat([]byte("sandgate"), 1<<17) // 1 MiB
	f, err := fc.Create("a.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	f.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fc.Mkdir("dir"))
	must(fc.Rename("a.bin", "dir/b.bin"))
	must(fc.Symlink("dir/b.bin", "link"))
	must(fc.Chmod("dir/b.bin", 0o600))
	st, err := fc.Stat("link")
	must(err)
	if st.Size() != int64(len(data)) || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat via link: size %d mode %v", st.Size(), st.Mode())
	}
	rf, err := fc.Open("link")
	must(err)
	got, _ := io.ReadAll(rf)
	rf.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if target, err := fc.ReadLink("link"); err != nil || target != "dir/b.bin" {
		t.Fatalf("readlink = %q, %v", target, err)
	}
	entries, err := fc.ReadDir("/")
	must(err)
	if len(entries) != 2 {
		t.Fatalf("ls / = %d entries, want 2 (dir, link)", len(entries))
	}
	// What SFTP wrote, exec sees.
	if r := gwtest.Exec(t, c, "wc -c < dir/b.bin"); strings.TrimSpace(r.Stdout) != "1048576" {
		t.Fatalf("exec sees %q", r.Stdout)
	}
	if err := fc.Rename("link", "dir/b.bin"); err == nil {
		t.Fatal("rename over an existing file succeeded (SFTP v3 forbids it)")
	}
	must(fc.PosixRename("link", "link2"))
	must(fc.Remove("link2"))
	if err := fc.Remove("dir"); err == nil {
		t.Fatal("remove of a directory succeeded")
	}
	must(fc.Remove("dir/b.bin"))
	must(fc.RemoveDirectory("dir"))

	// Escapes: each must fail and read nothing of the host.
	workdir := filepath.Join(s.DataDir, "sessions", id)
	must(os.Symlink("/etc/passwd", filepath.Join(workdir, "passwd-link")))
	must(os.Symlink("../..", filepath.Join(workdir, "up")))
	must(fc.Symlink("/etc", "etc-link"))
	for _, p := range []string{"../../etc/passwd", "/../../../etc/passwd", "passwd-link", "up/passwd", "etc-link/passwd", "up/" + id + "/../../../../etc/passwd"} {
		if f, err := fc.Open(p); err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if bytes.Contains(b, []byte("root:")) {
				t.Errorf("get %s read the host's /etc/passwd", p)
			}
			t.Errorf("open %s succeeded", p)
		}
	}
	if _, err := fc.ReadDir("up"); err == nil {
		t.Error("listing a symlinked dir pointing up succeeded")
	}
	if err := fc.Mkdir("up/escaped"); err == nil {
		t.Error("mkdir through a symlink pointing up succeeded")
	}
	if _, err := fc.Create("etc-link/evil"); err == nil {
		t.Error("create through a symlink to /etc succeeded")
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Error("/etc/evil exists on the host")
	}
}

func waitFor(t *testing.T, b *gwtest.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %q in %q", want, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestChannelsPerConnectionCapped(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	var open []*gossh.Session
	defer func() {
		for _, o := range open {
			o.Close()
		}
	}()
	for i := 0; i < sshd.MaxChannelsPerConn; i++ {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatalf("channel %d: %v", i, err)
		}
		open = append(open, sess)
	}
	if _, err := c.NewSession(); err == nil || !strings.Contains(err.Error(), "too many") {
		t.Fatalf("channel past the cap: %v, want refused", err)
	}
	open[0].Close()
	open = open[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		sess, err := c.NewSession()
		if err == nil {
			open = append(open, sess)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no channel after one closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConnectionEnv: every command learns its connection as under
// OpenSSH (SSH_CLIENT, SSH_CONNECTION), from the tunnel's TCP ends, and a
// client allowed to send those names cannot replace them.
func TestConnectionEnv(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{SSH: sshd.Config{EnvAllow: []string{"SSH_*"}}})
	c := s.SSH(t, s.CreateSession(t, nil).SessionID)
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		t.Fatalf("the tunnel is not TCP: %v -> %v", c.LocalAddr(), c.RemoteAddr())
	}
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Setenv("SSH_CLIENT", "10.9.9.9 1 2"); err != nil {
		t.Fatal(err)
	}
	out, err := sess.Output(`echo "$SSH_CLIENT"; echo "$SSH_CONNECTION"`)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s %d %d\n%s %d %s %d\n", local.IP, local.Port, remote.Port, local.IP, local.Port, remote.IP, remote.Port)
	if string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}
