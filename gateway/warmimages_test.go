package gateway_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// heldImages is an image source of images present (any name, one digest
// each) that records the holds, as the image store's refs do.
type heldImages struct {
	mu    sync.Mutex
	holds map[string]string // session id -> image name
	warm  map[string]bool   // the holds of unclaimed warm sandboxes
}

func (h *heldImages) Check(string) error { return nil }

func (h *heldImages) Resolve(_ context.Context, name string) (*sandbox.Image, error) {
	return &sandbox.Image{Name: name, Digest: "sha256:" + name}, nil
}

func (h *heldImages) Hold(id string, img *sandbox.Image) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds[id] = img.Name
	delete(h.warm, id)
	return nil
}

func (h *heldImages) HoldWarm(id string, img *sandbox.Image) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.warm == nil {
		h.warm = map[string]bool{}
	}
	h.holds[id], h.warm[id] = img.Name, true
	return nil
}

// warmHeld says whether id's hold is a warm sandbox's.
func (h *heldImages) warmHeld(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.warm[id]
}

func (h *heldImages) Release(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.holds, id)
	delete(h.warm, id)
}

func (h *heldImages) held() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.holds)
}

// rootlessDriver makes real workdir sandboxes for specs of any image (the
// workdir driver runs none: its sandboxes stand for the image's).
type rootlessDriver struct{ inner *workdir.Driver }

func (d rootlessDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	spec.Image = nil
	return d.inner.Create(ctx, spec)
}

// newImageManager is a manager with warm pools of images over a workdir
// driver, its image source and its sandboxes' root.
func newImageManager(t *testing.T, cfg gateway.Config) (*gateway.Manager, *heldImages, string) {
	t.Helper()
	root := t.TempDir()
	wd, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	src := &heldImages{holds: map[string]string{}}
	cfg.ImageSource = src
	m := gateway.NewManager(cfg, rootlessDriver{wd}, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	return m, src, root
}

func waitWarm(t *testing.T, m *gateway.Manager, image string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); m.WarmSandboxes()[image] != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("want %d warm sandboxes of %s, have %v", n, image, m.WarmSandboxes())
		}
	}
}

// A create of an image whose sandbox trusts the session's egress CA
// (rules per request here; bound secrets alike) neither claims a warm
// sandbox of the image nor starts its pool: an image's trust store is its
// build's, so the claim could only destroy the warm sandbox, in the
// create's time, before a cold create. The image's pool keeps its
// sandboxes for the creates that can claim them; every hold of the image
// (warm sandboxes', sessions') is let go by the shutdown.
func TestWarmPoolImageWithCA(t *testing.T) {
	m, src, root := newImageManager(t, gateway.Config{WarmPool: 1, WarmPoolImageTTL: time.Hour, ReapInterval: time.Hour,
		Egress: egressConfig(t, "*.test")})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); m.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	p := gateway.Principal{Tenant: "a"}
	rules := []string{`{"host":"pypi.test","methods":["GET"]}`}
	waitWarm(t, m, "default", 1) // Run has begun: creates start pools

	// With a CA, an image used for the first time gets no pool.
	mustCreate(t, m, p, gateway.CreateParams{Image: "tools/b:1", Egress: rules})
	mustCreate(t, m, p, gateway.CreateParams{Image: "tools/a:1"}) // starts a's pool
	waitWarm(t, m, "tools/a:1", 1)
	if _, ok := m.WarmSandboxes()["tools/b:1"]; ok {
		t.Errorf("creates of tools/b:1 with an egress CA started its pool: %v", m.WarmSandboxes())
	}
	pooled := dirNames(t, root)
	s, _ := mustCreate(t, m, p, gateway.CreateParams{Image: "tools/a:1", Egress: rules})
	if slices.Contains(pooled, s.ID) {
		t.Fatalf("the create with an egress CA took warm sandbox %s of %v", s.ID, pooled)
	}
	if n := m.WarmSandboxes()["tools/a:1"]; n != 1 {
		t.Errorf("warm sandboxes of tools/a:1 after a create with an egress CA: %d, want 1", n)
	}
	// A create without one claims it.
	s2, _ := mustCreate(t, m, p, gateway.CreateParams{Image: "tools/a:1"})
	if !slices.Contains(pooled, s2.ID) {
		t.Errorf("session %s did not claim a warm sandbox of tools/a:1 %v", s2.ID, pooled)
	}
	if h := src.held(); h[s.ID] != "tools/a:1" || h[s2.ID] != "tools/a:1" {
		t.Errorf("holds %v: want the sessions' %s and %s", h, s.ID, s2.ID)
	}
	// The pool's holds are warm ones (an image removal does not wait for
	// them); the claim made s2's a session's.
	if src.warmHeld(s2.ID) || src.warmHeld(s.ID) {
		t.Errorf("a session's image hold is still a warm sandbox's (s %v, s2 %v)", src.warmHeld(s.ID), src.warmHeld(s2.ID))
	}
	waitWarm(t, m, "tools/a:1", 1)
	warm := 0
	for id := range src.held() {
		if src.warmHeld(id) {
			warm++
		}
	}
	if warm != 1 {
		t.Errorf("warm holds: %d, want 1 (the refilled pool's sandbox)", warm)
	}
	cancel()
	<-ran
	m.Shutdown(context.Background(), false)
	if h := src.held(); len(h) != 0 {
		t.Errorf("holds left after the shutdown: %v", h)
	}
}
