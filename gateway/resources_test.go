package gateway_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// specDriver records the specs a real workdir driver is handed.
type specDriver struct {
	gateway.Driver
	mu    sync.Mutex
	specs []sandbox.Spec
}

func (d *specDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	d.specs = append(d.specs, spec)
	d.mu.Unlock()
	return d.Driver.Create(ctx, spec)
}

func (d *specDriver) last() sandbox.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.specs[len(d.specs)-1]
}

func ptr[T any](v T) *T { return &v }

func TestManagerResources(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := &specDriver{Driver: wd}
	store := gateway.NewMemStore()
	m := gateway.NewManager(gateway.Config{
		Store: store, MaxSessionsPerTenant: 50,
		Resources: gateway.ResourceBounds{
			Default: gateway.Resources{MemoryMiB: 256, CPUs: 0.5, Pids: 100, DiskMiB: 512},
			Max:     gateway.Resources{MemoryMiB: 2048, Pids: 1000}, // cpus, disk: 4 x the default
		},
	}, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	ctx := context.Background()

	t.Run("defaults", func(t *testing.T) {
		s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
		want := gateway.Resources{MemoryMiB: 256, CPUs: 0.5, Pids: 100, DiskMiB: 512}
		if got := s.Snapshot().Resources; got == nil || *got != want {
			t.Errorf("resources %+v, want %+v", got, want)
		}
		if l := d.last().Limits; l != (sandbox.Limits{}) {
			t.Errorf("a create without resources handed the driver %+v, want its own defaults", l)
		}
	})
	t.Run("requested", func(t *testing.T) {
		s, _ := mustCreate(t, m, alice, gateway.CreateParams{Resources: &gateway.ResourceRequest{
			MemoryMiB: ptr[int64](1024), CPUs: ptr(2.0), DiskMiB: ptr[int64](2048),
		}})
		// Without DiskFixed the disk asked for is in force too.
		want := gateway.Resources{MemoryMiB: 1024, CPUs: 2, Pids: 100, DiskMiB: 2048}
		if got := s.Snapshot().Resources; got == nil || *got != want {
			t.Errorf("resources %+v, want %+v", got, want)
		}
		if l := d.last().Limits; l != (sandbox.Limits{MemoryBytes: 1 << 30, CPUs: 2, WorkspaceBytes: 2 << 30}) {
			t.Errorf("driver limits %+v", l)
		}
		recs := mustAll(t, store)
		found := false
		for _, r := range recs {
			if r.ID == s.ID {
				found = r.Resources != nil && *r.Resources == want
			}
		}
		if !found {
			t.Errorf("the store does not keep the session's resources: %+v", recs)
		}
	})
	t.Run("bounds", func(t *testing.T) {
		for _, c := range []struct {
			req     gateway.ResourceRequest
			code    string
			mention []string
		}{
			{gateway.ResourceRequest{MemoryMiB: ptr[int64](4096)}, "resources_exceeded", []string{"memoryMiB", "2048", "sandbox-max-memory"}},
			{gateway.ResourceRequest{CPUs: ptr(2.5)}, "resources_exceeded", []string{"cpus", "2", "sandbox-max-cpus"}},
			{gateway.ResourceRequest{Pids: ptr[int64](1001)}, "resources_exceeded", []string{"pids", "1000", "sandbox-max-pids"}},
			{gateway.ResourceRequest{DiskMiB: ptr[int64](2049)}, "resources_exceeded", []string{"diskMiB", "2048", "sandbox-max-disk"}},
			{gateway.ResourceRequest{MemoryMiB: ptr[int64](0)}, "invalid_resources", []string{"memoryMiB", "32"}},
			{gateway.ResourceRequest{CPUs: ptr(-1.0)}, "invalid_resources", []string{"cpus"}},
			{gateway.ResourceRequest{Pids: ptr[int64](1)}, "invalid_resources", []string{"pids", "8"}},
			{gateway.ResourceRequest{DiskMiB: ptr[int64](1)}, "invalid_resources", []string{"diskMiB", "16"}},
			// A huge value is shown as the integer it is, never as a float.
			{gateway.ResourceRequest{Pids: ptr[int64](math.MaxInt64)}, "resources_exceeded", []string{"pids is 9223372036854775807,", "limit of 1000 "}},
			{gateway.ResourceRequest{MemoryMiB: ptr[int64](math.MinInt64)}, "invalid_resources", []string{"at least 32 MiB, got -9223372036854775808"}},
			{gateway.ResourceRequest{CPUs: ptr(1e300)}, "resources_exceeded", []string{"cpus is 1e+300,", "limit of 2 "}},
		} {
			_, _, err := m.Create(ctx, alice, gateway.CreateParams{Resources: &c.req})
			wantCode(t, err, gateway.KindInvalid, c.code)
			if ge, _ := gateway.AsError(err); ge != nil {
				for _, w := range c.mention {
					if !strings.Contains(ge.Message, w) {
						t.Errorf("%q does not mention %q", ge.Message, w)
					}
				}
			}
		}
		// At the caps exactly: accepted.
		mustCreate(t, m, alice, gateway.CreateParams{Resources: &gateway.ResourceRequest{
			MemoryMiB: ptr[int64](2048), CPUs: ptr(2.0), Pids: ptr[int64](1000), DiskMiB: ptr[int64](2048),
		}})
	})
	t.Run("disk-fixed", func(t *testing.T) {
		m2 := gateway.NewManager(gateway.Config{Resources: gateway.ResourceBounds{DiskFixed: true}}, d, discardLog())
		t.Cleanup(func() { m2.Shutdown(context.Background(), false) })
		s, _ := mustCreate(t, m2, alice, gateway.CreateParams{Resources: &gateway.ResourceRequest{DiskMiB: ptr[int64](4096)}})
		if got := s.Snapshot().Resources; got.DiskMiB != sandbox.DefaultWorkspaceBytes>>20 || got.MemoryMiB != sandbox.DefaultMemoryBytes>>20 {
			t.Errorf("resources %+v, want the default disk in force", got)
		}
		if l := d.last().Limits; l.WorkspaceBytes != 0 {
			t.Errorf("driver asked for a workspace of %d bytes", l.WorkspaceBytes)
		}
		_, _, err := m2.Create(ctx, alice, gateway.CreateParams{Resources: &gateway.ResourceRequest{DiskMiB: ptr[int64](4097)}})
		wantCode(t, err, gateway.KindInvalid, "resources_exceeded")
	})
	t.Run("idempotency", func(t *testing.T) {
		cp := gateway.CreateParams{IdempotencyKey: "res-1", Resources: &gateway.ResourceRequest{Pids: ptr[int64](200)}}
		s, _ := mustCreate(t, m, alice, cp)
		again, pw, err := m.Create(ctx, alice, cp)
		if err != nil || again != s || pw != "" {
			t.Fatalf("replay: %v %v", again, err)
		}
		cp.Resources = &gateway.ResourceRequest{Pids: ptr[int64](300)}
		_, _, err = m.Create(ctx, alice, cp)
		wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
		// Asking for the defaults is the same request as asking for nothing.
		cp = gateway.CreateParams{IdempotencyKey: "res-2"}
		s, _ = mustCreate(t, m, alice, cp)
		cp.Resources = &gateway.ResourceRequest{MemoryMiB: ptr[int64](256)}
		if again, _, err := m.Create(ctx, alice, cp); err != nil || again != s {
			t.Errorf("explicit defaults did not replay: %v", err)
		}
	})
}
