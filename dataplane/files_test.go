package dataplane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// filesBinary builds the sandgate binary (static, as the Makefile does:
// a linux sandbox runs it as its init and SFTP server) into a directory
// of t's.
func filesBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// A linux sandbox's init, mapped to another user, must reach it.
	for d := dir; d != filepath.Dir(d) && strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "sandgate")
	build := exec.Command("go", "build", "-o", bin, "github.com/sandgate/sandgate/cmd/sandgate")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sandgate: %v\n%s", err, out)
	}
	return bin
}

// filesRequireLinux skips where the linux driver cannot run, and fails in
// CI, where it must.
func filesRequireLinux(t *testing.T) {
	t.Helper()
	_, err := os.Stat("/proc/self/ns/user")
	if runtime.GOOS == "linux" && os.Geteuid() == 0 && err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the linux driver needs root and user namespaces in CI")
	}
	t.Skip("the linux driver needs root and user namespaces")
}

// filesSandbox is one sandbox of a driver under test, and what the host
// sees of it.
type filesSandbox struct {
	driver string
	sb     sandbox.Sandbox
	// outside is a host directory the sandbox must never reach; it holds
	// a canary file "canary".
	outside string
}

func newFilesSandbox(t *testing.T, driver, bin string) *filesSandbox {
	t.Helper()
	ctx := context.Background()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "canary"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	var d sandbox.Driver
	switch driver {
	case "workdir":
		// The workdirs live next to the canary: "../canary" is one step out.
		wd, err := workdir.New(workdir.Config{Root: filepath.Join(outside, "sandboxes"), SelfExe: bin})
		if err != nil {
			t.Fatal(err)
		}
		d = wd
	case "linux":
		filesRequireLinux(t)
		ld, err := linuxns.New(sandbox.Config{DataDir: t.TempDir(), SelfExe: bin})
		if err != nil {
			t.Fatal(err)
		}
		d = ld
	}
	sb, err := d.Create(ctx, sandbox.Spec{ID: "sbx-files" + strings.ToLower(driver[:3])})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return &filesSandbox{driver: driver, sb: sb, outside: outside}
}

// run runs a shell command in the sandbox and returns its output.
func (s *filesSandbox) run(t *testing.T, cmd string) string {
	t.Helper()
	p, err := s.sb.Start(context.Background(), sandbox.Cmd{Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Stdin().Close()
	var out, errb bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&out, p.Stdout()) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&errb, p.Stderr()) }()
	wg.Wait()
	ex, err := p.Wait()
	if err != nil || ex.Code != 0 || ex.Signal != "" {
		t.Fatalf("%s: %+v %v\n%s%s", cmd, ex, err, out.String(), errb.String())
	}
	return out.String()
}

func (s *filesSandbox) open(t *testing.T) *dataplane.FS {
	t.Helper()
	f, err := dataplane.OpenFS(context.Background(), s.sb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func kindOf(err error) dataplane.ErrKind {
	var fe *dataplane.Error
	if errors.As(err, &fe) {
		return fe.Kind
	}
	return -1
}

func readAll(t *testing.T, f *dataplane.FS, p string) ([]byte, error) {
	t.Helper()
	rc, _, err := f.Open(p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// failingReader yields n bytes, then fails as a client that went away.
type failingReader struct{ n int }

func (r *failingReader) Read(b []byte) (int, error) {
	if r.n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(b) > r.n {
		b = b[:r.n]
	}
	for i := range b {
		b[i] = 'x'
	}
	r.n -= len(b)
	return len(b), nil
}

func TestFiles(t *testing.T) {
	bin := filesBinary(t)
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			s := newFilesSandbox(t, driver, bin)
			f := s.open(t)
			t.Run("write read stat", func(t *testing.T) { testWriteRead(t, s, f) })
			t.Run("list", func(t *testing.T) { testList(t, s, f) })
			t.Run("remove", func(t *testing.T) { testRemove(t, s, f) })
			t.Run("errors", func(t *testing.T) { testFileErrors(t, s, f) })
			t.Run("confinement", func(t *testing.T) { testConfinement(t, s, f) })
		})
	}
}

func testWriteRead(t *testing.T, s *filesSandbox, f *dataplane.FS) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16+7) // several packets, not aligned
	mode := fs.FileMode(0o600)
	for _, tc := range []struct {
		name    string
		path    string
		data    []byte
		opts    dataplane.WriteOptions
		created bool
		mode    string
	}{
		{"new small", "hello.txt", []byte("hello\n"), dataplane.WriteOptions{}, true, "0644"},
		{"replace keeps mode", "hello.txt", []byte("bye\n"), dataplane.WriteOptions{}, false, "0644"},
		{"mode", "secret.txt", []byte("s"), dataplane.WriteOptions{Mode: &mode}, true, "0600"},
		{"mkdirs", "a/b/c/deep.bin", big, dataplane.WriteOptions{Mkdirs: true}, true, "0644"},
		{"empty", "empty", nil, dataplane.WriteOptions{}, true, "0644"},
		{"under the cap", "capped", []byte("12345"), dataplane.WriteOptions{MaxBytes: 5}, true, "0644"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, created, err := f.Write(tc.path, bytes.NewReader(tc.data), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if created != tc.created || e.Type != "file" || e.SizeBytes != int64(len(tc.data)) || e.Mode != tc.mode || e.Path != tc.path {
				t.Errorf("entry %+v created %v, want size %d mode %s created %v", e, created, len(tc.data), tc.mode, tc.created)
			}
			if time.Since(e.Mtime) > time.Minute {
				t.Errorf("mtime %v", e.Mtime)
			}
			got, err := readAll(t, f, tc.path)
			if err != nil || !bytes.Equal(got, tc.data) {
				t.Errorf("read back %d bytes, %v; want %d", len(got), err, len(tc.data))
			}
		})
	}
	// Seeks land where they say: ServeContent serves ranges with them.
	rc, _, err := f.Open("a/b/c/deep.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, off := range []int64{1 << 20, 5, int64(len(big)) - 3, 300 << 10} {
		if _, err := rc.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 3)
		if _, err := io.ReadFull(rc, b); err != nil || !bytes.Equal(b, big[off:off+3]) {
			t.Errorf("at %d: %q %v, want %q", off, b, err, big[off:off+3])
		}
	}
	if end, _ := rc.Seek(0, io.SeekEnd); end != int64(len(big)) {
		t.Errorf("end %d", end)
	}
	// What the sandbox's own processes see.
	if got := s.run(t, "cat hello.txt; stat -c %a secret.txt"); got != "bye\n600\n" {
		t.Errorf("in the sandbox: %q", got)
	}
}

func testList(t *testing.T, s *filesSandbox, f *dataplane.FS) {
	s.run(t, "mkdir -p tree/sub/subsub && echo 1 > tree/one && echo 22 > tree/sub/two && ln -s / tree/root && ln -s sub tree/sublink && touch tree/sub/subsub/three")
	entries, truncated, err := f.List("tree", false, 0)
	if err != nil || truncated {
		t.Fatal(err, truncated)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Path+":"+e.Type)
	}
	if want := "tree/one:file tree/root:symlink tree/sub:dir tree/sublink:symlink"; strings.Join(got, " ") != want {
		t.Errorf("list %v, want %s", got, want)
	}
	if entries[0].SizeBytes != 2 || entries[0].Mode != "0644" || entries[0].Name != "one" {
		t.Errorf("entry %+v", entries[0])
	}
	// Recursive: breadth first, never through a symlink (tree/root is /).
	entries, truncated, err = f.List("tree", true, 0)
	if err != nil || truncated || len(entries) != 7 {
		t.Fatalf("recursive: %d entries %v %v: %+v", len(entries), truncated, err, entries)
	}
	if entries[6].Path != "tree/sub/subsub/three" {
		t.Errorf("last %+v", entries[6])
	}
	entries, truncated, err = f.List("tree", true, 3)
	if err != nil || !truncated || len(entries) != 3 {
		t.Errorf("capped: %d entries, truncated %v, %v", len(entries), truncated, err)
	}
	// A link to a directory lists the directory.
	if entries, _, err := f.List("tree/sublink", false, 0); err != nil || len(entries) != 2 || entries[0].Path != "tree/sublink/subsub" {
		t.Errorf("via link: %+v %v", entries, err)
	}
	if _, _, err := f.List("tree/one", false, 0); kindOf(err) != dataplane.KindNotDir {
		t.Errorf("list a file: %v", err)
	}
	if _, _, err := f.List("nope", false, 0); kindOf(err) != dataplane.KindNotFound {
		t.Errorf("list nothing: %v", err)
	}
}

func testRemove(t *testing.T, s *filesSandbox, f *dataplane.FS) {
	s.run(t, "mkdir -p rm/full/d rm/empty && echo x > rm/full/d/f && echo y > rm/file && ln -s ../rm/full rm/link && echo keep > keep")
	for _, tc := range []struct {
		path      string
		recursive bool
		kind      dataplane.ErrKind // -1: removed
	}{
		{"rm/file", false, -1},
		{"rm/file", false, dataplane.KindNotFound},
		{"rm/full", false, dataplane.KindNotEmpty},
		{"rm/empty", false, -1},
		{"rm/link", true, -1}, // the link, not its target
		{"rm/full", true, -1},
		{".", true, dataplane.KindInvalid},
		{"/", true, dataplane.KindInvalid},
		{"rm/..", true, dataplane.KindInvalid},
	} {
		err := f.Remove(tc.path, tc.recursive)
		if tc.kind == -1 && err != nil || tc.kind != -1 && kindOf(err) != tc.kind {
			t.Errorf("Remove(%q, %v) = %v, want kind %d", tc.path, tc.recursive, err, tc.kind)
		}
	}
	if got := s.run(t, "ls -A rm; cat keep"); got != "keep\n" {
		t.Errorf("left: %q", got)
	}
}

func testFileErrors(t *testing.T, s *filesSandbox, f *dataplane.FS) {
	s.run(t, "mkdir -p errs/dir && echo f > errs/file && mkfifo errs/fifo")
	for _, tc := range []struct {
		name string
		op   func() error
		kind dataplane.ErrKind
	}{
		{"read missing", func() error { _, err := readAll(t, f, "errs/missing"); return err }, dataplane.KindNotFound},
		{"read dir", func() error { _, err := readAll(t, f, "errs/dir"); return err }, dataplane.KindIsDir},
		{"read fifo", func() error { _, err := readAll(t, f, "errs/fifo"); return err }, dataplane.KindNotRegular},
		{"read under a file", func() error { _, err := readAll(t, f, "errs/file/x"); return err }, dataplane.KindNotFound},
		{"write over dir", func() error {
			_, _, err := f.Write("errs/dir", strings.NewReader("x"), dataplane.WriteOptions{})
			return err
		}, dataplane.KindIsDir},
		{"write no parent", func() error {
			_, _, err := f.Write("errs/none/x", strings.NewReader("x"), dataplane.WriteOptions{})
			return err
		}, dataplane.KindNotFound},
		{"write under a file", func() error {
			_, _, err := f.Write("errs/file/x", strings.NewReader("x"), dataplane.WriteOptions{Mkdirs: true})
			return err
		}, dataplane.KindNotDir},
		{"write parent is file", func() error {
			_, _, err := f.Write("errs/file/x", strings.NewReader("x"), dataplane.WriteOptions{})
			return err
		}, dataplane.KindNotDir},
		{"write root", func() error { _, _, err := f.Write("/", strings.NewReader("x"), dataplane.WriteOptions{}); return err }, dataplane.KindInvalid},
		{"over the cap", func() error {
			_, _, err := f.Write("errs/big", bytes.NewReader(make([]byte, 1<<20)), dataplane.WriteOptions{MaxBytes: 1000})
			return err
		}, dataplane.KindTooLarge},
		{"over the cap keeps the old file", func() error {
			_, _, err := f.Write("errs/file", bytes.NewReader(make([]byte, 1<<20)), dataplane.WriteOptions{MaxBytes: 1<<20 - 1})
			return err
		}, dataplane.KindTooLarge},
		{"aborted upload", func() error {
			_, _, err := f.Write("errs/aborted", &failingReader{n: 2 << 20}, dataplane.WriteOptions{})
			return err
		}, dataplane.KindAborted},
		{"aborted replace", func() error {
			_, _, err := f.Write("errs/file", &failingReader{n: 100}, dataplane.WriteOptions{})
			return err
		}, dataplane.KindAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); kindOf(err) != tc.kind {
				t.Errorf("got %v (kind %d), want kind %d", err, kindOf(err), tc.kind)
			}
		})
	}
	// Nothing partial, no temporary file, the old content intact.
	if got := s.run(t, "ls -A errs; cat errs/file"); got != "dir\nfifo\nfile\nf\n" {
		t.Errorf("left: %q", got)
	}
	for _, p := range []string{"", "a\x00b", strings.Repeat("a", dataplane.MaxPathBytes+1)} {
		if _, err := dataplane.CheckPath(p); kindOf(err) != dataplane.KindInvalid {
			t.Errorf("CheckPath(%.20q) = %v", p, err)
		}
	}
}

// testConfinement tries to leave the sandbox by every path trick: each
// resolves inside it (a file of its own) or fails; the host's canary is
// never read or written.
func testConfinement(t *testing.T, s *filesSandbox, f *dataplane.FS) {
	host, err := os.ReadFile("/etc/shadow")
	if err != nil {
		host = []byte("unreadable")
	}
	canary := filepath.Join(s.outside, "canary")
	s.run(t, "ln -s / rootlink && ln -s ../.. uplink && ln -s /etc/shadow shadowlink && mkdir -p swap/in")
	for _, p := range []string{
		"../../etc/shadow", "/etc/shadow", "../canary", "/../canary", "../../../../../../" + canary,
		canary, "rootlink/etc/shadow", "rootlink" + canary, "uplink/canary", "uplink/uplink/canary", "shadowlink",
	} {
		got, err := readAll(t, f, p)
		if err == nil && (bytes.Equal(got, host) || bytes.Contains(got, []byte("host secret"))) {
			t.Errorf("read %q: got the host's file", p)
		}
		if s.driver == "workdir" && err == nil {
			t.Errorf("read %q on workdir: %q, want an error (nothing there)", p, got)
		}
	}
	// Writes through the same paths land inside or fail.
	for _, p := range []string{"../escaped", "/../escaped", "uplink/escaped", "rootlink/escaped", "../canary", canary} {
		_, _, _ = f.Write(p, strings.NewReader("escaped"), dataplane.WriteOptions{Mkdirs: true})
	}
	if err := filepath.WalkDir(s.outside, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "escaped" && !strings.HasPrefix(p, s.sb.Workdir()) {
			t.Errorf("a write escaped to %s", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(canary); string(b) != "host secret" {
		t.Errorf("canary changed: %q", b)
	}
	if _, err := os.Stat("/escaped"); err == nil {
		t.Errorf("a write escaped to /escaped")
		_ = os.Remove("/escaped")
	}
	if s.driver == "workdir" {
		// "/etc/shadow" on workdir is the workdir's own etc/shadow.
		if _, _, err := f.Write("/etc/shadow", strings.NewReader("mine"), dataplane.WriteOptions{Mkdirs: true}); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(s.sb.Workdir(), "etc", "shadow")); err != nil || string(b) != "mine" {
			t.Errorf("workdir's etc/shadow: %q %v", b, err)
		}
	}
	// A symlink swapped in mid-request: swap/in flips between a directory
	// and a link out while writes go through it.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := s.sb.Start(context.Background(), sandbox.Cmd{Command: "cd swap; while :; do rm -rf in; ln -s ../../.. in; rm -f in; mkdir in; done"})
		if err != nil {
			t.Error(err)
			return
		}
		<-stop
		p.Kill()
		_, _ = p.Wait()
	}()
	for i := 0; i < 200; i++ {
		_, _, _ = f.Write("swap/in/escaped", strings.NewReader("x"), dataplane.WriteOptions{})
		_, _ = readAll(t, f, "swap/in/canary")
	}
	close(stop)
	<-done
	for _, p := range []string{filepath.Join(s.outside, "escaped"), filepath.Join(filepath.Dir(s.sb.Workdir()), "escaped"), "/escaped"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("a write through a swapped link escaped to %s", p)
		}
	}
}
