//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// dataDirHasDirectIO says whether files in dir can be opened O_DIRECT
// (statx reports a direct I/O alignment), so that a loop device backed
// by one must do direct I/O.
func dataDirHasDirectIO(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.CreateTemp(dir, "dio-probe-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var st unix.Statx_t // statx reports the alignment for regular files only
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mask&unix.STATX_DIOALIGN != 0 && st.Dio_offset_align > 0 && st.Dio_offset_align <= 1024
}

// The workspace's loop device does direct I/O where the data dir's
// filesystem allows it (the image's pages are not cached twice), and the
// size limit still holds: a sandbox that fills its workspace gets ENOSPC,
// and its neighbour, on the same host filesystem, still writes.
func TestWorkspaceDirectIOAndLimit(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 64 << 20}})
	var sbs []sandbox.Sandbox
	for _, id := range []string{"sbx-dio-full", "sbx-dio-next"} {
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		requireExt4(t, sb)
		sbs = append(sbs, sb)
		image := filepath.Join(dataDir, "sandboxes", id, "workspace.img")
		devs := loopBackedBy(image)
		if len(devs) != 1 {
			t.Fatalf("loop devices on %s: %v, want one", image, devs)
		}
		dio, err := os.ReadFile(filepath.Join("/sys/block", devs[0], "loop", "dio"))
		if err != nil {
			t.Fatal(err)
		}
		want := "0"
		if dataDirHasDirectIO(t, dataDir) {
			want = "1"
		}
		if got := strings.TrimSpace(string(dio)); got != want {
			t.Errorf("%s (%s): dio %s, want %s", devs[0], id, got, want)
		}
	}
	// A sync write pushes the data through the loop device now.
	_, stderr, e := runIn(t, sbs[0], "head -c 100m /dev/zero > /workspace/fill; r=$?; sync; exit $r")
	if e.Code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Errorf("100 MiB in 64: exit %+v, stderr %q; want ENOSPC", e, stderr)
	}
	out, stderr, e := runIn(t, sbs[1], "head -c 16m /dev/zero > /workspace/f && sync && stat -c %s /workspace/f")
	if e.Code != 0 || strings.TrimSpace(out) != fmt.Sprint(16<<20) {
		t.Errorf("16 MiB in the neighbour: %q %q %+v", out, stderr, e)
	}
	// And the full one frees space again.
	if _, stderr, e := runIn(t, sbs[0], "rm /workspace/fill && head -c 16m /dev/zero > /workspace/f"); e.Code != 0 {
		t.Errorf("write after rm: %q %+v", stderr, e)
	}
	for _, sb := range sbs {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWorkspaceWriteSpeed measures sustained writes into a sandbox's
// workspace against the same writes into a plain directory on the data
// dir's filesystem: 10 rounds of 256 MiB (SANDGATE_WRITE_MIB) each way,
// alternating, overwriting one file each side, as repeated uploads do,
// each round until the data is on disk. It
// logs each round and the ratio, asserts nothing about time, and only
// runs when SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 TMPDIR=/var/tmp go test -count=1 -run TestWorkspaceWriteSpeed -v ./sandbox/linuxns/
func TestWorkspaceWriteSpeed(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	mib := 256
	if v := os.Getenv("SANDGATE_WRITE_MIB"); v != "" {
		fmt.Sscan(v, &mib)
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 4 << 30}})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-speed"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	requireExt4(t, sb)
	host := filepath.Join(dataDir, "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	// Each write ends with an fsync of the file (sync FILE), so that a
	// round pays for its own writeback, not the next one: sustained
	// speed, what a stream of uploads gets once the page cache is full.
	// SANDGATE_WRITE_CACHED=1 leaves the fsync out.
	write := fmt.Sprintf("head -c %dm /dev/zero > %%[1]s/big.bin && sync %%[1]s/big.bin", mib)
	if os.Getenv("SANDGATE_WRITE_CACHED") == "1" {
		write = fmt.Sprintf("head -c %dm /dev/zero > %%[1]s/big.bin", mib)
	}
	inSandbox := func() time.Duration {
		t0 := time.Now()
		if _, stderr, e := runIn(t, sb, fmt.Sprintf(write, "/workspace")); e.Code != 0 {
			t.Fatalf("sandbox write: %q %+v", stderr, e)
		}
		return time.Since(t0)
	}
	onHost := func() time.Duration {
		t0 := time.Now()
		if out, err := exec.Command("sh", "-c", fmt.Sprintf(write, host)).CombinedOutput(); err != nil {
			t.Fatalf("host write: %v %s", err, out)
		}
		return time.Since(t0)
	}
	var sumS, sumH time.Duration
	for i := range 10 {
		var s, h time.Duration
		if i%2 == 0 {
			s, h = inSandbox(), onHost()
		} else {
			h, s = onHost(), inSandbox()
		}
		sumS += s
		sumH += h
		t.Logf("round %2d: workspace %v (%.0f MB/s), host dir %v (%.0f MB/s)", i+1, s.Round(time.Millisecond),
			float64(mib<<20)/s.Seconds()/1e6, h.Round(time.Millisecond), float64(mib<<20)/h.Seconds()/1e6)
	}
	t.Logf("total: workspace %v, host dir %v: workspace speed / host speed = %.2f", sumS.Round(time.Millisecond), sumH.Round(time.Millisecond), sumH.Seconds()/sumS.Seconds())
}
