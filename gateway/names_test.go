package gateway_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

func TestSessionNameValidation(t *testing.T) {
	m, _ := newManager(t, gateway.Config{})
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"build-42.main_x", true},
		{"9lives", true},
		{strings.Repeat("n", 63), true},
		{strings.Repeat("n", 64), false},
		{"-lead", false},
		{".hidden", false},
		{"has space", false},
		{"slash/y", false},
		{"ünï", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Name: c.name})
			if c.ok {
				if err != nil {
					t.Fatalf("create %q: %v", c.name, err)
				}
				if got := s.Snapshot().Name; got != c.name {
					t.Errorf("view name %q, want %q", got, c.name)
				}
				if err := m.Delete(context.Background(), alice, s.ID); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, gateway.KindInvalid, "invalid_name")
		})
	}
}

func TestSessionNames(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t, gateway.Config{})
	s1, _ := mustCreate(t, m, alice, gateway.CreateParams{Name: "web"})

	_, _, err := m.Create(ctx, alice, gateway.CreateParams{Name: "web"})
	wantCode(t, err, gateway.KindConflict, "name_taken")

	// Another tenant has names of its own.
	sb, _ := mustCreate(t, m, bob, gateway.CreateParams{Name: "web"})

	for _, c := range []struct {
		p    gateway.Principal
		name string
		want string
	}{
		{alice, "web", s1.ID},
		{bob, "web", sb.ID},
		{alice, "nope", ""},
		{gateway.Principal{Tenant: "carol"}, "web", ""},
	} {
		got, total := m.ListFiltered(ctx, c.p, gateway.ListFilter{Name: c.name}, 10, 0)
		switch {
		case c.want == "" && (total != 0 || len(got) != 0):
			t.Errorf("%s ?name=%s: %d sessions, want none", c.p.Tenant, c.name, total)
		case c.want != "" && (total != 1 || len(got) != 1 || got[0].ID != c.want):
			t.Errorf("%s ?name=%s: %d sessions, want %s", c.p.Tenant, c.name, total, c.want)
		}
	}
	if _, total := m.ListFiltered(ctx, alice, gateway.ListFilter{}, 10, 0); total != 1 {
		t.Errorf("unfiltered list: %d, want 1", total)
	}

	// A deleted session's name is free again.
	if err := m.Delete(ctx, alice, s1.ID); err != nil {
		t.Fatal(err)
	}
	s2, _ := mustCreate(t, m, alice, gateway.CreateParams{Name: "web"})
	if s2.ID == s1.ID {
		t.Fatal("same id")
	}
	// Sessions without a name never clash.
	mustCreate(t, m, alice, gateway.CreateParams{})
	mustCreate(t, m, alice, gateway.CreateParams{})
}

// TestSessionNameConcurrentCreates: of creates racing for one name,
// exactly one wins.
func TestSessionNameConcurrentCreates(t *testing.T) {
	m, _ := newManager(t, gateway.Config{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, taken := 0, 0
	for range 8 {
		wg.Go(func() {
			_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Name: "race"})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				wins++
				return
			}
			if ge, ok := gateway.AsError(err); ok && ge.Code == "name_taken" {
				taken++
				return
			}
			t.Errorf("create: %v", err)
		})
	}
	wg.Wait()
	if wins != 1 || taken != 7 {
		t.Errorf("%d wins, %d name_taken; want 1 and 7", wins, taken)
	}
}

// TestSessionNameIdempotency: a replay with the same name returns the
// session (no name_taken); the same key with another name is a reuse.
func TestSessionNameIdempotency(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t, gateway.Config{})
	cp := gateway.CreateParams{Name: "job", IdempotencyKey: "k-1"}
	s1, _ := mustCreate(t, m, alice, cp)
	s2, pw, err := m.Create(ctx, alice, cp)
	if err != nil || s2.ID != s1.ID || pw != "" {
		t.Fatalf("replay: %v %q %v; want %s", s2, pw, err, s1.ID)
	}
	_, _, err = m.Create(ctx, alice, gateway.CreateParams{Name: "other", IdempotencyKey: "k-1"})
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
}

// TestSessionNamePersisted: the name is in the record, so a restarted
// gateway shows it, finds the session by it and still refuses a clash.
func TestSessionNamePersisted(t *testing.T) {
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
	m1, store1 := open()
	s1, _ := mustCreate(t, m1, alice, gateway.CreateParams{Name: "keeper"})
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
	s, err := m2.Get(ctx, alice, s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Snapshot().Name; got != "keeper" {
		t.Errorf("restored name %q, want keeper", got)
	}
	if got, _ := m2.ListFiltered(ctx, alice, gateway.ListFilter{Name: "keeper"}, 10, 0); len(got) != 1 || got[0].ID != s1.ID {
		t.Errorf("lookup after restore: %v", got)
	}
	_, _, err = m2.Create(ctx, alice, gateway.CreateParams{Name: "keeper"})
	wantCode(t, err, gateway.KindConflict, "name_taken")
	if owner, ok := m2.Owner(s1.ID); !ok || owner != "alice" {
		t.Errorf("Owner = %q, %v", owner, ok)
	}
}

// TestResolveNameCase: OpenSSH lowercases a host name before the proxy
// sees it, so a name is found whatever its case when only one name
// matches so; an exact match wins, and two names that differ only by
// case leave the folded spelling unresolved.
func TestResolveNameCase(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t, gateway.Config{})
	dev, _ := mustCreate(t, m, alice, gateway.CreateParams{Name: "MyDev"})
	web, _ := mustCreate(t, m, alice, gateway.CreateParams{Name: "Web"})
	web2, _ := mustCreate(t, m, alice, gateway.CreateParams{Name: "web"})
	for _, c := range []struct {
		p         gateway.Principal
		ref, want string
	}{
		{alice, "MyDev", dev.ID},
		{alice, "mydev", dev.ID},
		{alice, "MYDEV", dev.ID},
		{alice, "Web", web.ID},
		{alice, "web", web2.ID},
		{alice, "WEB", "WEB"},
		{bob, "mydev", "mydev"},
	} {
		if got := m.Resolve(ctx, c.p, c.ref); got != c.want {
			t.Errorf("%s Resolve(%q) = %q, want %q", c.p.Tenant, c.ref, got, c.want)
		}
	}
}
