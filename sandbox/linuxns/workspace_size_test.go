//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
)

// workspaceFS is the type and size (KiB, as df shows it) of sb's
// /workspace.
func workspaceFS(t testing.TB, sb sandbox.Sandbox) (fstype string, kib int64) {
	t.Helper()
	out, stderr, e := runIn(t, sb, "stat -f -c %T /workspace; df -k /workspace | tail -n 1 | awk '{print $2}'")
	f := strings.Fields(out)
	if e.Code != 0 || len(f) != 2 {
		t.Fatalf("workspace of %v: %q %q %+v", sb, out, stderr, e)
	}
	kib, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q", out)
	}
	return f[0], kib
}

// requireExt4 fails (in CI) or skips the test unless sb's workspace is an
// ext4 image: these tests are about images on real loop devices.
func requireExt4(t testing.TB, sb sandbox.Sandbox) {
	t.Helper()
	if typ, _ := workspaceFS(t, sb); typ != "ext2/ext3" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("workspace is %s, not an ext4 image, in CI", typ)
		}
		t.Skipf("workspace is %s here, not an ext4 image (no mkfs.ext4 or loop devices)", typ)
	}
}

// checkWorkspaceSize fails unless df in sb shows a workspace of roughly
// size bytes (a fresh ext4 keeps a few percent for its metadata).
func checkWorkspaceSize(t testing.TB, sb sandbox.Sandbox, size int64) {
	t.Helper()
	_, kib := workspaceFS(t, sb)
	if want := size >> 10; kib > want || kib < want*85/100 {
		t.Errorf("workspace is %d KiB, want about %d KiB", kib, want)
	}
}

// loopBackedBy lists the loop devices whose backing file is image.
func loopBackedBy(image string) []string {
	var devs []string
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if f, _ := os.ReadFile(b); strings.TrimSpace(string(f)) == image {
			devs = append(devs, filepath.Base(filepath.Dir(filepath.Dir(b))))
		}
	}
	return devs
}

// templatesIn lists the workspace templates kept under dataDir.
func templatesIn(dataDir string) []string {
	m, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", ".workspace-*"))
	return m
}

// A session's WorkspaceBytes is its workspace's size: 100 MiB do not fit
// in 64 MiB (write or fallocate) and do in 256 MiB; zero is the driver's
// size. Each is an image on a loop device, and Destroy leaves no loop
// device, image or mount.
func TestWorkspaceSizePerSession(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 128 << 20}})
	for _, tc := range []struct {
		id    string
		size  int64 // asked
		want  int64 // in force
		fits  bool  // 100 MiB
		write string
	}{
		{"sbx-ws64", 64 << 20, 64 << 20, false, "head -c 100m /dev/zero > /workspace/big"},
		{"sbx-ws64-falloc", 64 << 20, 64 << 20, false, "fallocate -l 100m /workspace/big"},
		{"sbx-ws256", 256 << 20, 256 << 20, true, "head -c 100m /dev/zero > /workspace/big && fallocate -l 100m /workspace/big2"},
		{"sbx-ws-default", 0, 128 << 20, true, "head -c 100m /dev/zero > /workspace/big"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: tc.id, Limits: sandbox.Limits{WorkspaceBytes: tc.size}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			requireExt4(t, sb)
			image := filepath.Join(dataDir, "sandboxes", tc.id, "workspace.img")
			if devs := loopBackedBy(image); len(devs) != 1 {
				t.Errorf("loop devices on %s: %v, want one", image, devs)
			}
			checkWorkspaceSize(t, sb, tc.want)
			_, stderr, exit := runIn(t, sb, tc.write)
			if tc.fits && exit.Code != 0 {
				t.Errorf("100 MiB in %d MiB: exit %+v, stderr %q", tc.want>>20, exit, stderr)
			}
			if !tc.fits && (exit.Code == 0 || !strings.Contains(stderr, "No space left on device")) {
				t.Errorf("100 MiB in %d MiB: exit %+v, stderr %q; want ENOSPC", tc.want>>20, exit, stderr)
			}
			if err := sb.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
			if devs := loopBackedBy(image); len(devs) != 0 {
				t.Errorf("loop devices left on %s: %v", image, devs)
			}
			if _, err := os.Stat(image); !os.IsNotExist(err) {
				t.Errorf("image left: %v", err)
			}
			if leaks := leaksUnder(dataDir); len(leaks) > 0 {
				t.Errorf("left: %v", leaks)
			}
		})
	}
	// The default's template and one for each other size asked.
	if tpls := templatesIn(dataDir); len(tpls) != 3 {
		t.Errorf("templates %v, want 3", tpls)
	}
}

// Creates of one new size at once make its template once, and each gets
// a workspace of that size.
func TestWorkspaceSizeConcurrent(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 64 << 20}})
	const n, size = 6, 96 << 20
	sbs := make([]sandbox.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sbs[i], errs[i] = d.Create(context.Background(), sandbox.Spec{ID: "sbx-wsc-" + itoa(i), Limits: sandbox.Limits{WorkspaceBytes: size}})
		})
	}
	wg.Wait()
	for i, sb := range sbs {
		if errs[i] != nil {
			t.Error(errs[i])
			continue
		}
		defer sb.Destroy(context.Background())
	}
	if t.Failed() {
		return
	}
	requireExt4(t, sbs[0])
	for _, sb := range sbs {
		checkWorkspaceSize(t, sb, size)
	}
	want := []string{".workspace-" + strconv.Itoa(64<<20) + ".img", ".workspace-" + strconv.Itoa(size) + ".img"}
	var got []string
	for _, p := range templatesIn(dataDir) {
		got = append(got, filepath.Base(p))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("templates %v, want %v", got, want)
	}
	for _, sb := range sbs {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Error(err)
		}
	}
	if leaks := leaksUnder(dataDir); len(leaks) > 0 {
		t.Errorf("left: %v", leaks)
	}
}

// However many sizes sessions ask, a bounded number of templates stays
// in the data dir (the least recently used go), and a size whose template
// went is made again.
func TestWorkspaceTemplatesBounded(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 32 << 20}})
	create := func(i int, mib int64) {
		t.Helper()
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-wsb-" + itoa(i), Limits: sandbox.Limits{WorkspaceBytes: mib << 20}})
		if err != nil {
			t.Fatal(err)
		}
		requireExt4(t, sb)
		checkWorkspaceSize(t, sb, mib<<20)
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		create(i, int64(16+i))
	}
	tpls := templatesIn(dataDir)
	if len(tpls) != 1+linuxns.MaxSizedTemplates {
		t.Errorf("%d templates after 12 sizes, want %d: %v", len(tpls), 1+linuxns.MaxSizedTemplates, tpls)
	}
	for _, mib := range []int{16, 17, 18, 19} {
		if slices.Contains(tpls, filepath.Join(dataDir, "sandboxes", fmt.Sprintf(".workspace-%d.img", mib<<20))) {
			t.Errorf("the template of %d MiB, among the least recently used, is still there", mib)
		}
	}
	create(20, 16) // evicted: made again
	if n := len(templatesIn(dataDir)); n != 1+linuxns.MaxSizedTemplates {
		t.Errorf("%d templates, want %d", n, 1+linuxns.MaxSizedTemplates)
	}
}

// A size no filesystem can have fails the create and leaves nothing: no
// image, loop device, mount, directory or template.
func TestWorkspaceSizeFailureCleansUp(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 32 << 20}})
	before := templatesIn(dataDir)
	if _, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-ws-tiny", Limits: sandbox.Limits{WorkspaceBytes: 4096}}); err == nil {
		t.Fatal("a 4 KiB workspace was made")
	} else {
		t.Logf("4 KiB: %v", err)
	}
	if leaks := leaksUnder(dataDir); len(leaks) > 0 {
		t.Errorf("left: %v", leaks)
	}
	if after := templatesIn(dataDir); !slices.Equal(after, before) {
		t.Errorf("templates %v, were %v", after, before)
	}
	// The driver still makes sandboxes, of any size.
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-ws-after", Limits: sandbox.Limits{WorkspaceBytes: 48 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	checkWorkspaceSize(t, sb, 48<<20)
}

// A sized workspace is found again by the driver of the next run, files
// and size, and goes with the adopted sandbox's Destroy.
func TestWorkspaceSizeAdopted(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 32 << 20}})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-ws-adopt", Limits: sandbox.Limits{WorkspaceBytes: 80 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	requireExt4(t, sb)
	if _, _, e := runIn(t, sb, "echo kept > /workspace/f"); e.Code != 0 {
		t.Fatalf("write: %+v", e)
	}
	if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	d2 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true, Limits: sandbox.Limits{WorkspaceBytes: 32 << 20}})
	ad, err := d2.Adopt(context.Background(), "sbx-ws-adopt")
	if err != nil {
		t.Fatal(err)
	}
	defer ad.Destroy(context.Background())
	if out, _, _ := runIn(t, ad, "cat /workspace/f"); out != "kept\n" {
		t.Errorf("after adoption: %q", out)
	}
	checkWorkspaceSize(t, ad, 80<<20)
	image := filepath.Join(dataDir, "sandboxes", "sbx-ws-adopt", "workspace.img")
	if err := ad.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if devs := loopBackedBy(image); len(devs) != 0 {
		t.Errorf("loop devices left on %s: %v", image, devs)
	}
}

// Without ext4 images, the tmpfs workspace has the size asked too.
func TestWorkspaceSizeTmpfs(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir, Limits: sandbox.Limits{WorkspaceBytes: 8 << 20}})
	d.UseTmpfsWorkspaces()
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-ws-tmpfs", Limits: sandbox.Limits{WorkspaceBytes: 24 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	typ, kib := workspaceFS(t, sb)
	if typ != "tmpfs" || kib != 24<<10 {
		t.Errorf("workspace: %s of %d KiB, want tmpfs of %d", typ, kib, 24<<10)
	}
	if _, stderr, e := runIn(t, sb, "head -c 16m /dev/zero > /workspace/a"); e.Code != 0 {
		t.Errorf("16 MiB in 24: %+v %q", e, stderr)
	}
	if _, stderr, e := runIn(t, sb, "head -c 16m /dev/zero > /workspace/b"); e.Code == 0 || !strings.Contains(stderr, "No space left") {
		t.Errorf("32 MiB in 24: %+v %q; want ENOSPC", e, stderr)
	}
}

// TestWorkspaceCreateLatency measures Create (p50 and p90 over 20) for the
// default size, for another size whose template is made (a size asked
// before), and for a new size each time (its template is formatted on the
// create path). It only runs when SANDGATE_MEASURE=1:
//
//	SANDGATE_MEASURE=1 go test -count=1 -run TestWorkspaceCreateLatency -v ./sandbox/linuxns/
func TestWorkspaceCreateLatency(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE") != "1" {
		t.Skip("set SANDGATE_MEASURE=1 to measure")
	}
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	const n = 20
	seq := 0
	measure := func(name string, size func(i int) int64) {
		var took []time.Duration
		for i := range n {
			seq++
			start := time.Now()
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-wsl-" + itoa(seq), Limits: sandbox.Limits{WorkspaceBytes: size(i)}})
			if err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
			if i == 0 {
				requireExt4(t, sb)
			}
			if err := sb.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(took)
		t.Logf("%-34s p50 %6.1f ms  p90 %6.1f ms", name, ms(took[n/2]), ms(took[n*9/10]))
	}
	measure("default (1 GiB)", func(int) int64 { return 0 })
	measure("4 GiB, template made", func(int) int64 { return 4 << 30 })
	measure("256 MiB, template made", func(int) int64 { return 256 << 20 })
	measure("new size each time (≤4 GiB)", func(i int) int64 { return int64(3000+i) << 20 })
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Through the REST API: resources.diskMiB is the session's workspace
// size, shown in the session and seen on the host.
func TestWorkspaceDiskMiBThroughGateway(t *testing.T) {
	s := linuxStack(t)
	sess := s.CreateSession(t, map[string]any{"resources": map[string]any{"diskMiB": 64}})
	var got struct {
		Resources struct {
			DiskMiB int64 `json:"diskMiB"`
		} `json:"resources"`
	}
	if code := s.Do(t, s.Token, http.MethodGet, "/v1/sessions/"+sess.SessionID, nil, &got); code != http.StatusOK {
		t.Fatalf("get session: %d", code)
	}
	if got.Resources.DiskMiB != 64 {
		t.Errorf("session shows diskMiB %d, want 64", got.Resources.DiskMiB)
	}
	h := inspect(t, s, sess.SessionID)
	var st unix.Statfs_t
	if err := unix.Statfs(h.workdir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		if os.Getenv("CI") == "true" {
			t.Fatal("workspace is tmpfs in CI")
		}
		t.Skip("workspace is tmpfs here")
	}
	if kib := int64(st.Blocks) * st.Bsize >> 10; kib > 64<<10 || kib < 64<<10*85/100 {
		t.Errorf("workspace is %d KiB, want about %d", kib, 64<<10)
	}
	deleteSession(t, s, sess.SessionID)
	h.checkGone(t)
}
