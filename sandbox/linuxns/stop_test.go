//go:build linux

package linuxns_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// ownedLayer is an image layer with /var/mine, a directory the sandbox
// user (uid 1000 in the image) may write: what it writes there lands in
// the overlay's upper dir, outside /workspace.
func ownedLayer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mine := filepath.Join(dir, "var", "mine")
	if err := os.MkdirAll(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mine, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hostOf is the host's view of sandbox sb of driver dataDir, while it runs.
func hostOf(t *testing.T, dataDir, id string, sb sandbox.Sandbox) hostSandbox {
	t.Helper()
	l := sb.(interface {
		InitPID() int
		HostUID() int
	})
	ns := pinPidNS(t, l.InitPID())
	return hostSandbox{id: id, dataDir: dataDir, initPID: l.InitPID(), pidNS: ns, hostUID: l.HostUID(), workdir: sb.Workdir()}
}

// checkStopped fails unless sandbox h has no process and no cgroup left,
// and refuses to start one.
func checkStopped(t *testing.T, h hostSandbox, sb sandbox.Sandbox) {
	t.Helper()
	if !sb.(sandbox.Stopper).Stopped() {
		t.Error("Stopped() = false after Stop")
	}
	if alive(h.initPID) {
		t.Errorf("init %d still runs after Stop", h.initPID)
	}
	if left := h.survivors(); len(left) > 0 {
		t.Errorf("%d processes survived Stop: %+v", len(left), left)
	}
	for _, c := range cgroupsOf(h.id) {
		t.Errorf("cgroup %s is still there after Stop", c)
	}
	if _, err := sb.Start(context.Background(), sandbox.Cmd{Command: "true"}); !errors.Is(err, sandbox.ErrStopped) {
		t.Errorf("Start of a stopped sandbox: %v, want ErrStopped", err)
	}
	select {
	case <-sb.(sandbox.Ender).Done():
		t.Error("Done is closed after Stop: the gateway would fail the session")
	default:
	}
}

// Stop kills every process of a sandbox and removes its cgroups; its
// files (the workspace and, for an image, the root's writable layer) are
// still there when Resume starts a new init on them. A new driver adopts a
// stopped sandbox as stopped, and Remove leaves nothing of it.
func TestLinuxStopResume(t *testing.T) {
	requireLinux(t)
	tests := []struct {
		name  string
		image bool
	}{
		{"default root", false},
		{"image root", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := t.TempDir()
			t.Cleanup(func() { checkNoLeaks(t, dataDir) })
			d := openLinux(t, sandbox.Config{DataDir: dataDir})
			id := "sbx-stop-" + map[bool]string{false: "default", true: "image"}[tt.image]
			spec := sandbox.Spec{ID: id}
			write := "echo kept > /workspace/f; sleep 100007 >/dev/null 2>&1 &"
			read := "cat /workspace/f; ps -eo args | grep -c '^sleep 100007'"
			want := "kept\n0\n"
			home := "" // where /workspace is on the workspace filesystem
			if tt.image {
				spec.Image = &sandbox.Image{Name: "test/busybox", Digest: "sha256:test",
					Layers: []string{busyboxLayer(t), ownedLayer(t)}, Env: []string{"PATH=/bin"}}
				write = "echo upper > /var/mine/f; " + write
				read = "cat /var/mine/f; " + read
				want = "upper\n" + want
				home = "home"
			}
			sb, err := d.Create(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			destroyed := false
			t.Cleanup(func() {
				if !destroyed {
					_ = sb.Destroy(context.Background())
				}
			})
			if _, stderr, e := runIn(t, sb, write); e.Code != 0 {
				t.Fatalf("%q: %+v %s", write, e, stderr)
			}
			h := hostOf(t, dataDir, id, sb)
			if !waitFor(5e9, func() bool { return len(h.survivors()) >= 2 }) {
				t.Fatalf("the background sleep is not running: %+v", h.survivors())
			}
			st := sb.(sandbox.Stopper)
			if err := st.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			checkStopped(t, h, sb)
			if err := st.Stop(context.Background()); err != nil {
				t.Fatalf("second Stop: %v", err)
			}
			// The files are on the host while stopped.
			if b, err := os.ReadFile(filepath.Join(sb.Workdir(), home, "f")); err != nil || string(b) != "kept\n" {
				t.Errorf("workspace file while stopped: %q %v", b, err)
			}
			if tt.image {
				upper := filepath.Join(sb.Workdir(), ".root", "upper", "var", "mine", "f")
				if b, err := os.ReadFile(upper); err != nil || string(b) != "upper\n" {
					t.Errorf("overlay upper file while stopped: %q %v", b, err)
				}
			}

			if err := st.Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := st.Resume(context.Background()); err != nil {
				t.Fatalf("second Resume: %v", err)
			}
			if out, stderr, _ := runIn(t, sb, read); out != want {
				t.Fatalf("after Resume: %q (stderr %q), want %q", out, stderr, want)
			}
			h2 := hostOf(t, dataDir, id, sb)
			// A new init (the old one is dead: checkStopped).
			if h2.initPID == h.initPID {
				t.Errorf("Resume kept the init %d", h.initPID)
			}
			if h2.hostUID != h.hostUID {
				t.Errorf("Resume moved the sandbox from host uid %d to %d", h.hostUID, h2.hostUID)
			}

			// A stopped sandbox outlives its driver: the next adopts it stopped.
			if _, _, e := runIn(t, sb, "echo again > /workspace/g"); e.Code != 0 {
				t.Fatal(e)
			}
			if err := st.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := sb.(sandbox.Detacher).Detach(context.Background()); err != nil {
				t.Fatal(err)
			}
			destroyed = true
			d2 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
			ad, err := d2.Adopt(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ad.Destroy(context.Background()) })
			checkStopped(t, h2, ad)
			if err := ad.(sandbox.Stopper).Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
			if out, stderr, _ := runIn(t, ad, read+"; cat /workspace/g"); out != want+"again\n" {
				t.Fatalf("adopted, resumed: %q (stderr %q)", out, stderr)
			}
			h3 := hostOf(t, dataDir, id, ad)
			if err := ad.(sandbox.Stopper).Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			checkStopped(t, h3, ad)
			if err := ad.(sandbox.Detacher).Detach(context.Background()); err != nil {
				t.Fatal(err)
			}

			// Remove of a stopped sandbox leaves nothing (checkNoLeaks).
			d3 := openLinux(t, sandbox.Config{DataDir: dataDir, KeepOrphans: true})
			if err := d3.Remove(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			h3.checkGone(t)
		})
	}
}

// Destroy of a stopped sandbox removes everything it owns.
func TestLinuxDestroyStopped(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-stop-destroy"})
	if err != nil {
		t.Fatal(err)
	}
	h := hostOf(t, dataDir, "sbx-stop-destroy", sb)
	if err := sb.(sandbox.Stopper).Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.(sandbox.Ender).Done():
	default:
		t.Error("Done is open after Destroy")
	}
	if err := sb.(sandbox.Stopper).Resume(context.Background()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Resume after Destroy: %v, want ErrClosed", err)
	}
	h.checkGone(t)
}

// The state file says stopped, so that a crashed gateway's successor
// knows; the driver's own on-disk names are checked only loosely.
func TestLinuxStoppedStateOnDisk(t *testing.T) {
	dataDir := t.TempDir()
	t.Cleanup(func() { checkNoLeaks(t, dataDir) })
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-stop-state"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	if err := sb.(sandbox.Stopper).Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", "sbx-stop-state", "state.json"))
	if err != nil || !strings.Contains(string(b), `"stopped": true`) {
		t.Fatalf("state file: %s %v", b, err)
	}
}
