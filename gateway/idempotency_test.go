package gateway_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// TestCreateIdempotencyKey: a key the tenant used before, with the same
// payload, returns the same session without its password, creates nothing
// and takes no quota; another payload is refused; another tenant's key of
// the same text is its own; a deleted session frees its key.
func TestCreateIdempotencyKey(t *testing.T) {
	clock := newClock()
	m, root := newManager(t, gateway.Config{Now: clock.Now, MaxSessionsPerTenant: 1})
	ctx := context.Background()
	cp := gateway.CreateParams{IdempotencyKey: "order-17", Metadata: map[string]any{"job": "a"}}

	s, pw := mustCreate(t, m, alice, cp)
	if pw == "" {
		t.Fatal("the first create returned no password")
	}
	// The same request, with the defaults spelled out; alice is at her quota.
	again := cp
	again.TTL, again.Image = gateway.DefaultTTL, "default"
	s2, pw2, err := m.Create(ctx, alice, again)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if s2.ID != s.ID || pw2 != "" {
		t.Errorf("replay gave session %s password %q; want %s and none", s2.ID, pw2, s.ID)
	}
	if n := dirCount(t, root); n != 1 {
		t.Errorf("%d sandboxes after a replay, want 1", n)
	}

	other := cp
	other.Metadata = map[string]any{"job": "b"}
	_, _, err = m.Create(ctx, alice, other)
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
	_, _, err = m.Create(ctx, alice, gateway.CreateParams{IdempotencyKey: "order-17", TTL: 120, Metadata: cp.Metadata})
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")

	b, bpw := mustCreate(t, m, bob, cp)
	if b.ID == s.ID || bpw == "" {
		t.Error("bob's key of the same text gave alice's session")
	}

	if err := m.Delete(ctx, alice, s.ID); err != nil {
		t.Fatal(err)
	}
	s3, pw3 := mustCreate(t, m, alice, cp)
	if s3.ID == s.ID || pw3 == "" {
		t.Error("the key of a deleted session did not make a new one")
	}

	// After the window the key is forgotten (the session is not reaped here).
	clock.Advance(gateway.IdempotencyWindow)
	if err := m.Delete(ctx, bob, b.ID); err != nil {
		t.Fatal(err)
	}
	m2, _ := newManager(t, gateway.Config{Now: clock.Now})
	old, _ := mustCreate(t, m2, alice, cp)
	clock.Advance(gateway.IdempotencyWindow)
	if s4, pw4 := mustCreate(t, m2, alice, cp); s4.ID == old.ID || pw4 == "" {
		t.Error("a key older than the window replayed")
	}
}

func TestCreateIdempotencyKeyBounds(t *testing.T) {
	m, root := newManager(t, gateway.Config{})
	for _, key := range []string{strings.Repeat("k", gateway.MaxIdempotencyKeyLen+1), "tab\tkey", "del\x7f", "é", "nul\x00"} {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{IdempotencyKey: key})
		wantCode(t, err, gateway.KindInvalid, "invalid_idempotency_key")
	}
	if n := dirCount(t, root); n != 0 {
		t.Errorf("invalid keys made %d sandboxes", n)
	}
	mustCreate(t, m, alice, gateway.CreateParams{IdempotencyKey: strings.Repeat("k", gateway.MaxIdempotencyKeyLen)})
	mustCreate(t, m, alice, gateway.CreateParams{IdempotencyKey: ` "quoted" ~!`})
}

// gatedDriver holds every Create until release is closed.
type gatedDriver struct {
	inner   *workdir.Driver
	entered chan struct{}
	release chan struct{}
}

func (d *gatedDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.entered <- struct{}{}
	<-d.release
	return d.inner.Create(ctx, spec)
}

// TestCreateIdempotencyKeyInProgress: while the first create with a key
// runs, the same key is 409-like (retry later), or 422-like with another
// payload; neither waits for it or creates anything.
func TestCreateIdempotencyKeyInProgress(t *testing.T) {
	root := t.TempDir()
	wd, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	d := &gatedDriver{inner: wd, entered: make(chan struct{}, 1), release: make(chan struct{})}
	m := gateway.NewManager(gateway.Config{}, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	ctx := context.Background()
	cp := gateway.CreateParams{IdempotencyKey: "k1"}

	type created struct {
		s   *gateway.Session
		err error
	}
	first := make(chan created, 1)
	go func() {
		s, _, err := m.Create(ctx, alice, cp)
		first <- created{s, err}
	}()
	<-d.entered
	_, _, err = m.Create(ctx, alice, cp)
	wantCode(t, err, gateway.KindConflict, "idempotency_key_in_progress")
	if ge, _ := gateway.AsError(err); ge == nil || ge.RetryAfter <= 0 {
		t.Errorf("in-progress error without RetryAfter: %+v", ge)
	}
	_, _, err = m.Create(ctx, alice, gateway.CreateParams{IdempotencyKey: "k1", TTL: 60})
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
	close(d.release)
	f := <-first
	if f.err != nil {
		t.Fatal(f.err)
	}
	s, pw, err := m.Create(ctx, alice, cp)
	if err != nil || s.ID != f.s.ID || pw != "" {
		t.Errorf("after the first finished: %v, %v, %q; want a replay of %s", s, err, pw, f.s.ID)
	}
}

// TestCreateIdempotencyKeySurvivesRestart: the key is in the session's
// record, so a restarted gateway that brings the session back replays it.
func TestCreateIdempotencyKeySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "sessions")
	open := func() (*gateway.Manager, *gateway.BoltStore) {
		store, err := gateway.OpenBoltStore(filepath.Join(dir, "sessions.db"))
		if err != nil {
			t.Fatal(err)
		}
		wd, err := workdir.New(workdir.Config{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		return gateway.NewManager(gateway.Config{Store: store}, wd, discardLog()), store
	}
	ctx := context.Background()
	cp := gateway.CreateParams{IdempotencyKey: "restart-1", TTL: 600}

	m1, store1 := open()
	s1, _ := mustCreate(t, m1, alice, cp)
	m1.Shutdown(ctx, true)
	store1.Close()

	m2, store2 := open()
	t.Cleanup(func() {
		m2.Shutdown(ctx, false)
		store2.Close()
	})
	if err := m2.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	s2, pw, err := m2.Create(ctx, alice, cp)
	if err != nil || s2.ID != s1.ID || pw != "" {
		t.Errorf("after a restart: %v %q %v; want a replay of %s", s2, pw, err, s1.ID)
	}
	_, _, err = m2.Create(ctx, alice, gateway.CreateParams{IdempotencyKey: "restart-1"})
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
}

// TestGatewayCapacityIsNotNamed: the gateway-wide limit answers a generic
// "capacity" (retry later) that does not tell a tenant how many sessions
// the others hold; the tenant's own limit may be named.
func TestGatewayCapacityIsNotNamed(t *testing.T) {
	m, _ := newManager(t, gateway.Config{MaxSessions: 3, MaxSessionsPerTenant: 2})
	mustCreate(t, m, alice, gateway.CreateParams{})
	mustCreate(t, m, alice, gateway.CreateParams{})
	_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{})
	wantCode(t, err, gateway.KindQuota, "quota_exceeded")
	mustCreate(t, m, bob, gateway.CreateParams{})
	_, _, err = m.Create(context.Background(), bob, gateway.CreateParams{})
	wantCode(t, err, gateway.KindUnavailable, "capacity")
	ge, _ := gateway.AsError(err)
	if ge == nil || ge.RetryAfter <= 0 || strings.ContainsAny(ge.Message, "0123456789") || strings.Contains(ge.Message, "max-sessions") {
		t.Errorf("capacity error %+v names a number or has no RetryAfter", ge)
	}
}

// TestCreateRejectsKeyOptions: authorized_keys options are refused (by
// name), not stored unenforced.
func TestCreateRejectsKeyOptions(t *testing.T) {
	m, root := newManager(t, gateway.Config{})
	key := authorizedKey(t)
	cases := []struct {
		key     string
		mention []string
	}{
		{`command="/bin/true" ` + key, []string{"command"}},
		{`from="10.0.0.0/8",no-pty ` + key, []string{"from", "no-pty"}},
		{`restrict ` + key, []string{"restrict"}},
		{key + "\n" + key, []string{"line"}},
		{"not a key\n" + key, []string{"line"}},
	}
	for _, c := range cases {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{SSHPublicKey: c.key})
		wantCode(t, err, gateway.KindInvalid, "invalid_ssh_public_key")
		ge, _ := gateway.AsError(err)
		for _, w := range c.mention {
			if ge != nil && !strings.Contains(ge.Message, w) {
				t.Errorf("%q: message %q does not name %q", c.key, ge.Message, w)
			}
		}
		if ge != nil && strings.Contains(ge.Message, "10.0.0.0") {
			t.Errorf("message repeats an option's value: %q", ge.Message)
		}
	}
	if n := dirCount(t, root); n != 0 {
		t.Errorf("%d sandboxes", n)
	}
	if s, _ := mustCreate(t, m, alice, gateway.CreateParams{SSHPublicKey: key}); s.SSHPublicKey != key {
		t.Errorf("stored key %q", s.SSHPublicKey)
	}
}

// TestCreateMetadataBounds: metadata nests at most MaxMetadataDepth levels,
// has at most MaxMetadataKeys keys at all levels together and at most
// MaxMetadataBytes of compact JSON.
func TestCreateMetadataBounds(t *testing.T) {
	m, _ := newManager(t, gateway.Config{MaxSessionsPerTenant: 1000})
	nest := func(levels int) map[string]any { // levels counts the metadata object itself
		var v any = "leaf"
		for i := 1; i < levels; i++ {
			if i%2 == 0 {
				v = []any{v}
			} else {
				v = map[string]any{"k": v}
			}
		}
		return map[string]any{"top": v}
	}
	keys := func(n int) map[string]any { // n keys in all, half of them one level down
		inner := map[string]any{}
		md := map[string]any{"inner": inner}
		for i := 1; i < n; i++ {
			if i%2 == 0 {
				md["k"+strings.Repeat("x", i)] = i
			} else {
				inner["k"+strings.Repeat("x", i)] = i
			}
		}
		return md
	}
	sized := func(n int) map[string]any { return map[string]any{"x": strings.Repeat("a", n-len(`{"x":""}`))} }
	cases := []struct {
		name string
		md   map[string]any
		code string // "": accepted
	}{
		{"depth at the limit", nest(gateway.MaxMetadataDepth), ""},
		{"one level too deep", nest(gateway.MaxMetadataDepth + 1), "metadata_too_deep"},
		{"500 levels", nest(500), "metadata_too_deep"},
		{"keys at the limit", keys(gateway.MaxMetadataKeys), ""},
		{"one key too many, nested", keys(gateway.MaxMetadataKeys + 1), "metadata_too_many_keys"},
		{"size at the limit", sized(gateway.MaxMetadataBytes), ""},
		{"one byte too large", sized(gateway.MaxMetadataBytes + 1), "metadata_too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Metadata: c.md})
			if c.code == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			wantCode(t, err, gateway.KindInvalid, c.code)
		})
	}
}
