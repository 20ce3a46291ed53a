package gateway_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

var (
	alice = gateway.Principal{Tenant: "alice", Method: "api_key"}
	bob   = gateway.Principal{Tenant: "bob", Method: "api_key"}
)

// fakeClock is an injectable clock (Config.Now).
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newManager returns a Manager over a real workdir driver on a temp dir,
// and that dir.
func newManager(t testing.TB, cfg gateway.Config) (*gateway.Manager, string) {
	t.Helper()
	return newManagerLog(t, cfg, discardLog())
}

func newManagerLog(t testing.TB, cfg gateway.Config, log *slog.Logger) (*gateway.Manager, string) {
	t.Helper()
	root := t.TempDir()
	driver, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(cfg, driver, log)
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	return m, root
}

func mustCreate(t testing.TB, m *gateway.Manager, p gateway.Principal, cp gateway.CreateParams) (*gateway.Session, string) {
	t.Helper()
	s, pw, err := m.Create(context.Background(), p, cp)
	if err != nil {
		t.Fatalf("create for %s: %v", p.Tenant, err)
	}
	return s, pw
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func dirCount(t testing.TB, root string) int {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func wantCode(t testing.TB, err error, kind gateway.Kind, code string) {
	t.Helper()
	ge, ok := gateway.AsError(err)
	if !ok {
		t.Fatalf("error %v is not a *gateway.Error", err)
	}
	if ge.Kind != kind || ge.Code != code {
		t.Errorf("error kind %d code %q, want %d %q (%v)", ge.Kind, ge.Code, kind, code, err)
	}
}

func authorizedKey(t testing.TB) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk))) + " me@host"
}

func TestManagerCreateGetDelete(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	m, root := newManager(t, gateway.Config{Now: clock.Now, Store: store, Images: []string{"default", "python"}})
	ctx := context.Background()
	key := authorizedKey(t)

	s, pw, err := m.Create(ctx, alice, gateway.CreateParams{
		TTL: 120, Image: "python", Metadata: map[string]any{"job": "x"}, SSHPublicKey: "  " + key + "\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	if snap.Tenant != "alice" || snap.Status != gateway.StatusRunning || snap.Image != "python" || snap.TTL != 120 ||
		snap.Metadata["job"] != "x" || !snap.CreatedAt.Equal(clock.Now()) ||
		!snap.ExpiresAt.Equal(clock.Now().Add(120*time.Second)) || !snap.LastActivityAt.Equal(clock.Now()) {
		t.Errorf("snapshot %+v", snap)
	}
	if !strings.HasPrefix(s.ID, "sbx-") || len(s.ID) != 24 {
		t.Errorf("id %q", s.ID)
	}
	if s.SSHPublicKey != key {
		t.Errorf("sshPublicKey %q, want it trimmed to %q", s.SSHPublicKey, key)
	}
	if pw == "" || !s.CheckPassword(pw) || s.CheckPassword(pw+"x") || s.CheckPassword("") {
		t.Error("CheckPassword does not check the password")
	}
	dir := s.Sandbox().Workdir()
	if filepath.Dir(dir) != root || !exists(dir) {
		t.Errorf("workdir %s under %s does not exist", dir, root)
	}
	if recs, _ := store.All(); len(recs) != 1 || recs[0].ID != s.ID || recs[0].Status != gateway.StatusRunning {
		t.Errorf("store holds %+v", recs)
	}
	for _, r := range mustAll(t, store) {
		if strings.Contains(fmt.Sprint(r), pw) {
			t.Error("the store keeps the password in clear")
		}
	}

	got, err := m.Get(ctx, alice, s.ID)
	if err != nil || got != s {
		t.Errorf("Get: %v, %v", got, err)
	}
	for _, c := range []struct {
		name string
		p    gateway.Principal
		id   string
	}{
		{"other tenant", bob, s.ID},
		{"missing", alice, "sbx-aaaaaaaaaaaaaaaaaaaa"},
		{"empty id", alice, ""},
		{"tenant with other method", gateway.Principal{Tenant: "ALICE"}, s.ID},
	} {
		if _, err := m.Get(ctx, c.p, c.id); !errors.Is(err, gateway.ErrNotFound) {
			t.Errorf("Get %s: %v, want ErrNotFound", c.name, err)
		}
		if err := m.Delete(ctx, c.p, c.id); !errors.Is(err, gateway.ErrNotFound) {
			t.Errorf("Delete %s: %v, want ErrNotFound", c.name, err)
		}
	}
	// Still alive for its owner after the other tenant's attempts.
	if _, err := m.Get(ctx, alice, s.ID); err != nil || !s.Live() || !exists(dir) {
		t.Fatalf("session hurt by another tenant's delete: %v", err)
	}

	closed := make(chan struct{})
	if _, ok := s.AddConn(func() { close(closed) }); !ok {
		t.Fatal("AddConn on a live session")
	}
	if err := m.Delete(ctx, alice, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("delete did not close the session's connections")
	}
	if exists(dir) {
		t.Error("delete left the workdir")
	}
	if st := s.Snapshot().Status; st != gateway.StatusDeleted || s.Live() {
		t.Errorf("status after delete %q", st)
	}
	if _, ok := s.AddConn(func() {}); ok {
		t.Error("AddConn accepted on a deleted session")
	}
	if _, err := m.Get(ctx, alice, s.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
	if err := m.Delete(ctx, alice, s.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("second Delete: %v", err)
	}
	if recs := mustAll(t, store); len(recs) != 0 {
		t.Errorf("store still holds %d records", len(recs))
	}
}

func mustAll(t testing.TB, s gateway.Store) []gateway.Record {
	t.Helper()
	recs, err := s.All()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestManagerCreateRejectsBadParams(t *testing.T) {
	m, root := newManager(t, gateway.Config{Images: []string{"default", "python", "node"}})
	cases := []struct {
		name string
		cp   gateway.CreateParams
		code string
		msg  []string
	}{
		{"ttl below", gateway.CreateParams{TTL: gateway.MinTTL - 1}, "invalid_ttl", []string{"ttl", "60", "28800"}},
		{"ttl above", gateway.CreateParams{TTL: gateway.MaxTTL + 1}, "invalid_ttl", []string{"ttl"}},
		{"ttl negative", gateway.CreateParams{TTL: -1}, "invalid_ttl", []string{"ttl"}},
		{"unknown image", gateway.CreateParams{Image: "ubuntu"}, "unknown_image", []string{"ubuntu", "default", "python", "node"}},
		{"image case", gateway.CreateParams{Image: "Default"}, "unknown_image", []string{"default"}},
		{"bad ssh key", gateway.CreateParams{SSHPublicKey: "ssh-ed25519 AAAA"}, "invalid_ssh_public_key", []string{"sshPublicKey"}},
		{"private key as ssh key", gateway.CreateParams{SSHPublicKey: "-----BEGIN OPENSSH PRIVATE KEY-----"}, "invalid_ssh_public_key", []string{"sshPublicKey"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := m.Create(context.Background(), alice, c.cp)
			wantCode(t, err, gateway.KindInvalid, c.code)
			for _, w := range c.msg {
				if ge, _ := gateway.AsError(err); ge != nil && !strings.Contains(ge.Message, w) {
					t.Errorf("message %q lacks %q", ge.Message, w)
				}
			}
		})
	}
	if _, total := m.List(context.Background(), alice, 100, 0); total != 0 || dirCount(t, root) != 0 {
		t.Errorf("bad params created %d sessions, %d sandboxes", total, dirCount(t, root))
	}
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if snap := s.Snapshot(); snap.TTL != gateway.DefaultTTL || s.Image != "default" || s.Metadata == nil {
		t.Errorf("defaults: ttl %d image %q metadata %v", snap.TTL, s.Image, s.Metadata)
	}
	for _, ttl := range []int{gateway.MinTTL, gateway.MaxTTL} {
		if s, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: ttl}); s.Snapshot().TTL != ttl {
			t.Errorf("ttl %d became %d", ttl, s.Snapshot().TTL)
		}
	}
}

func TestManagerList(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now})
	ctx := context.Background()
	var ids []string
	for range 5 {
		s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
		ids = append(ids, s.ID)
		clock.Advance(time.Second)
		mustCreate(t, m, bob, gateway.CreateParams{})
	}
	// Three created at the same instant: ordered by id.
	var same []string
	for range 3 {
		s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
		same = append(same, s.ID)
	}
	slices.Sort(same)
	ids = append(ids, same...)

	idsOf := func(ss []*gateway.Session) []string {
		out := []string{}
		for _, s := range ss {
			out = append(out, s.ID)
		}
		return out
	}
	cases := []struct {
		limit, offset int
		want          []string
	}{
		{100, 0, ids},
		{2, 0, ids[:2]},
		{2, 2, ids[2:4]},
		{3, 6, ids[6:8]},
		{1, 7, ids[7:]},
		{10, 8, []string{}},
		{10, 1 << 30, []string{}},
		{0, 0, []string{}},
	}
	for _, c := range cases {
		got, total := m.List(ctx, alice, c.limit, c.offset)
		if total != len(ids) {
			t.Errorf("limit %d offset %d: total %d, want %d", c.limit, c.offset, total, len(ids))
		}
		if got == nil {
			t.Errorf("limit %d offset %d: nil slice", c.limit, c.offset)
		}
		if !slices.Equal(idsOf(got), c.want) {
			t.Errorf("limit %d offset %d: %v, want %v", c.limit, c.offset, idsOf(got), c.want)
		}
	}
	if got, total := m.List(ctx, gateway.Principal{Tenant: "carol"}, 10, 0); len(got) != 0 || total != 0 {
		t.Errorf("carol sees %d of %d", len(got), total)
	}
	if _, total := m.List(ctx, bob, 100, 0); total != 5 {
		t.Errorf("bob has %d sessions, want 5", total)
	}
}

func TestManagerReapTTL(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1, Store: store})
	ctx := context.Background()
	short, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 60})
	long, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 120})

	clock.Advance(59 * time.Second)
	m.Reap(ctx)
	if !short.Live() || !long.Live() {
		t.Fatal("reaped before the TTL")
	}
	clock.Advance(time.Second) // exactly at expiresAt
	m.Reap(ctx)
	if short.Live() || short.Snapshot().Status != gateway.StatusExpired {
		t.Errorf("at its TTL the session is %q", short.Snapshot().Status)
	}
	if exists(short.Sandbox().Workdir()) {
		t.Error("expired session kept its workdir")
	}
	if _, err := m.Get(ctx, alice, short.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("Get of an expired session: %v", err)
	}
	if !long.Live() || !exists(long.Sandbox().Workdir()) {
		t.Error("the longer session went too")
	}
	// Activity does not extend a TTL.
	long.Touch(clock.Now())
	clock.Advance(60 * time.Second)
	m.Reap(ctx)
	if long.Live() || exists(long.Sandbox().Workdir()) {
		t.Error("activity extended the TTL")
	}
	if recs := mustAll(t, store); len(recs) != 0 {
		t.Errorf("store keeps %d expired sessions", len(recs))
	}
}

func TestManagerUpdateTTL(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1, Store: store})
	ctx := context.Background()
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 60})
	ttl := func(n int) gateway.UpdateParams { return gateway.UpdateParams{TTL: &n} }

	clock.Advance(50 * time.Second)
	got, err := m.Update(ctx, alice, s.ID, ttl(120))
	if err != nil || got != s {
		t.Fatalf("Update: %v, %v", got, err)
	}
	want := clock.Now().Add(120 * time.Second)
	if snap := s.Snapshot(); snap.TTL != 120 || !snap.ExpiresAt.Equal(want) || !s.ExpiresAt().Equal(want) {
		t.Errorf("after the update: ttl %d expiresAt %v, want 120 and %v", snap.TTL, snap.ExpiresAt, want)
	}
	if recs := mustAll(t, store); len(recs) != 1 || recs[0].TTL != 120 || !recs[0].ExpiresAt.Equal(want) {
		t.Errorf("store after the update: %+v", recs)
	}
	// Past the old expiry, before the new one: still running.
	clock.Advance(119 * time.Second)
	m.Reap(ctx)
	if !s.Live() {
		t.Fatal("reaped at the old expiry")
	}
	// A shorter ttl brings the expiry closer.
	if _, err := m.Update(ctx, alice, s.ID, ttl(gateway.MinTTL)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(gateway.MinTTL * time.Second)
	m.Reap(ctx)
	if s.Live() {
		t.Error("not reaped at the new, shorter expiry")
	}

	s2, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	for _, n := range []int{0, gateway.MinTTL - 1, gateway.MaxTTL + 1, -5} {
		_, err := m.Update(ctx, alice, s2.ID, ttl(n))
		wantCode(t, err, gateway.KindInvalid, "invalid_ttl")
	}
	for _, id := range []string{s.ID, "sbx-missing"} {
		if _, err := m.Update(ctx, alice, id, ttl(600)); !errors.Is(err, gateway.ErrNotFound) {
			t.Errorf("Update of %s: %v, want not found", id, err)
		}
	}
	if _, err := m.Update(ctx, bob, s2.ID, ttl(600)); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("another tenant's update: %v, want not found", err)
	}
	before := s2.Snapshot()
	if got, err := m.Update(ctx, alice, s2.ID, gateway.UpdateParams{}); err != nil || got.Snapshot().ExpiresAt != before.ExpiresAt {
		t.Errorf("an empty update: %v, expiry %v -> %v", err, before.ExpiresAt, got.Snapshot().ExpiresAt)
	}
}

func TestManagerUpdateStoreFailureKeepsExpiry(t *testing.T) {
	store := &switchStore{MemStore: gateway.NewMemStore()}
	m, _ := newManager(t, gateway.Config{Store: store})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 600})
	before := s.Snapshot()
	store.fail.Store(true)
	n := 7200
	_, err := m.Update(context.Background(), alice, s.ID, gateway.UpdateParams{TTL: &n})
	wantCode(t, err, gateway.KindUnavailable, "store_failed")
	if after := s.Snapshot(); after.TTL != before.TTL || !after.ExpiresAt.Equal(before.ExpiresAt) {
		t.Errorf("a change that was not recorded took effect: %+v", after)
	}
}

// switchStore fails its writes while fail is set.
type switchStore struct {
	*gateway.MemStore
	fail atomic.Bool
}

func (s *switchStore) Put(recs ...gateway.Record) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	return s.MemStore.Put(recs...)
}

func TestManagerReapIdle(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: 10 * time.Minute})
	ctx := context.Background()
	busy, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: gateway.MaxTTL})
	idle, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: gateway.MaxTTL})

	clock.Advance(9 * time.Minute)
	m.Reap(ctx)
	if !busy.Live() || !idle.Live() {
		t.Fatal("reaped before the idle limit")
	}
	busy.Touch(clock.Now())
	if !busy.LastActivity().Equal(clock.Now()) {
		t.Errorf("Touch: lastActivity %v, want %v", busy.LastActivity(), clock.Now())
	}
	busy.Touch(clock.Now().Add(-time.Hour)) // never moves back
	if !busy.LastActivity().Equal(clock.Now()) {
		t.Error("Touch moved lastActivity back")
	}

	clock.Advance(time.Minute) // idle: 10m without activity; busy: 1m
	m.Reap(ctx)
	if idle.Live() || idle.Snapshot().Status != gateway.StatusExpired || exists(idle.Sandbox().Workdir()) {
		t.Errorf("idle session: status %q", idle.Snapshot().Status)
	}
	if !busy.Live() {
		t.Fatal("a touched session was reaped as idle")
	}
	clock.Advance(8*time.Minute + 59*time.Second) // 9m59s since busy's last activity
	m.Reap(ctx)
	if !busy.Live() {
		t.Fatal("reaped 1s before its idle limit")
	}
	clock.Advance(time.Second)
	m.Reap(ctx)
	if busy.Live() || exists(busy.Sandbox().Workdir()) {
		t.Error("not reaped at its idle limit")
	}
}

// A session held by a call in progress (a long REST command, a followed
// stream, a transfer) is not idle, however long the call lasts.
func TestManagerReapSkipsHeld(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: 10 * time.Minute})
	ctx := context.Background()
	held, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: gateway.MaxTTL})
	release := held.Hold()
	release2 := held.Hold()
	clock.Advance(time.Hour)
	m.Reap(ctx)
	if !held.Live() {
		t.Fatal("a held session was reaped as idle")
	}
	release()
	release() // a second call changes nothing
	m.Reap(ctx)
	if !held.Live() {
		t.Fatal("reaped while another hold remains")
	}
	release2()
	m.Reap(ctx)
	if held.Live() {
		t.Error("not reaped once no call holds it")
	}
}

func TestManagerRunReaps(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, ReapInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 60})
	clock.Advance(time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for (s.Live() || exists(s.Sandbox().Workdir())) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s.Live() || exists(s.Sandbox().Workdir()) {
		t.Error("Run did not reap an expired session")
	}
}

// TestManagerQuotaConcurrent creates in parallel: exactly the quota succeeds.
func TestManagerQuotaConcurrent(t *testing.T) {
	cases := []struct {
		name             string
		cfg              gateway.Config
		tenants, perEach int
		want             int
		kind             gateway.Kind // of the refusals
		code             string
	}{
		{"per tenant", gateway.Config{MaxSessionsPerTenant: 10}, 1, 50, 10, gateway.KindQuota, "quota_exceeded"},
		{"gateway total", gateway.Config{MaxSessions: 10}, 5, 10, 10, gateway.KindUnavailable, "capacity"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, root := newManager(t, c.cfg)
			var ok, quota atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range c.tenants * c.perEach {
				p := gateway.Principal{Tenant: fmt.Sprintf("t%d", i%c.tenants)}
				wg.Go(func() {
					<-start
					_, _, err := m.Create(context.Background(), p, gateway.CreateParams{})
					if err == nil {
						ok.Add(1)
						return
					}
					if ge, _ := gateway.AsError(err); ge != nil && ge.Kind == c.kind && ge.Code == c.code {
						quota.Add(1)
						return
					}
					t.Errorf("create: %v", err)
				})
			}
			close(start)
			wg.Wait()
			if int(ok.Load()) != c.want || int(quota.Load()) != c.tenants*c.perEach-c.want {
				t.Errorf("%d created, %d over quota; want %d created", ok.Load(), quota.Load(), c.want)
			}
			if n := dirCount(t, root); n != c.want {
				t.Errorf("%d sandboxes, want %d", n, c.want)
			}
		})
	}
}

// gateHandler is a slog handler that blocks while logging msg until
// released, to stop a Create at its log line.
type gateHandler struct {
	msg     string
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func (h *gateHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *gateHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *gateHandler) WithGroup(string) slog.Handler            { return h }
func (h *gateHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg && h.armed.CompareAndSwap(true, false) {
		close(h.reached)
		<-h.release
	}
	return nil
}

// TestManagerQuotaNotDoubleCounted: while a Create finishes, its session
// must count once against the quota. Today it is both in the sessions map
// and still reserved as pending until Create returns, so a create that
// fits is refused.
func TestManagerQuotaNotDoubleCounted(t *testing.T) {
	h := &gateHandler{msg: "session_created", reached: make(chan struct{}), release: make(chan struct{})}
	m, _ := newManagerLog(t, gateway.Config{MaxSessionsPerTenant: 3}, slog.New(h))
	mustCreate(t, m, alice, gateway.CreateParams{})

	h.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{})
		done <- err
	}()
	<-h.reached // the second session is in the map; its Create has not returned
	_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{})
	close(h.release)
	if err2 := <-done; err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Errorf("third of 3 allowed sessions refused while the second was finishing: %v", err)
	}
	if _, total := m.List(context.Background(), alice, 100, 0); total > 3 {
		t.Errorf("%d sessions exceed the quota of 3", total)
	}
}

// flakyDriver fails the creates it is told to and passes the others on.
type flakyDriver struct {
	inner *workdir.Driver
	fail  atomic.Bool
}

func (d *flakyDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if d.fail.Load() {
		return nil, errors.New("no space left on device at /secret/host/path")
	}
	return d.inner.Create(ctx, spec)
}

func TestManagerSandboxFailureReleasesQuota(t *testing.T) {
	root := t.TempDir()
	wd, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	d := &flakyDriver{inner: wd}
	m := gateway.NewManager(gateway.Config{MaxSessionsPerTenant: 1, MaxSessions: 1}, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })

	d.fail.Store(true)
	for range 3 {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{})
		wantCode(t, err, gateway.KindUnavailable, "sandbox_failed")
		if ge, _ := gateway.AsError(err); ge != nil && strings.Contains(ge.Message, "/secret") {
			t.Errorf("message shows the driver's error: %q", ge.Message)
		}
	}
	if _, total := m.List(context.Background(), alice, 10, 0); total != 0 {
		t.Errorf("failed creates left %d sessions", total)
	}
	d.fail.Store(false)
	mustCreate(t, m, alice, gateway.CreateParams{}) // the quota slots came back
}

func TestManagerStoreFailureLeavesNothing(t *testing.T) {
	m, root := newManager(t, gateway.Config{Store: failingStore{gateway.NewMemStore()}})
	_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{})
	wantCode(t, err, gateway.KindUnavailable, "store_failed")
	if n := dirCount(t, root); n != 0 {
		t.Errorf("%d sandboxes left", n)
	}
	if _, total := m.List(context.Background(), alice, 10, 0); total != 0 {
		t.Errorf("%d sessions left", total)
	}
}

type failingStore struct{ *gateway.MemStore }

func (failingStore) Put(...gateway.Record) error { return errors.New("disk full") }

func TestManagerShutdownDestroysEverything(t *testing.T) {
	m, root := newManager(t, gateway.Config{})
	var ss []*gateway.Session
	for _, p := range []gateway.Principal{alice, alice, bob} {
		s, _ := mustCreate(t, m, p, gateway.CreateParams{})
		ss = append(ss, s)
	}
	m.Shutdown(context.Background(), false)
	for _, s := range ss {
		if s.Live() || exists(s.Sandbox().Workdir()) {
			t.Errorf("%s survived shutdown", s.ID)
		}
	}
	if n := dirCount(t, root); n != 0 {
		t.Errorf("%d sandboxes after shutdown", n)
	}
}

// TestManagerDeleteKillsProcesses: a process the session started, even one
// that left its process group, dies with the session.
func TestManagerDeleteKillsProcesses(t *testing.T) {
	m, _ := newManager(t, gateway.Config{})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	p, err := s.Sandbox().Start(context.Background(), sandbox.Cmd{
		Command: "setsid sleep 300 & echo $! > " + pidFile + "; wait",
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stdout()) }()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	waited := make(chan struct{})
	go func() { // as sshd does: someone always waits for the process
		defer close(waited)
		_, _ = p.Wait()
	}()
	var pid int
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(pidFile); err == nil && len(b) > 1 {
			if _, err := fmt.Sscan(string(b), &pid); err == nil {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatal("the background process did not start")
	}
	if err := m.Delete(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	<-waited
	deadline = time.Now().Add(5 * time.Second)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if processAlive(pid) {
		t.Errorf("process %d outlived its session", pid)
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
