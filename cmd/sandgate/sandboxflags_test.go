package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"536870912", 512 << 20, true},
		{"512MiB", 512 << 20, true},
		{"512mib", 512 << 20, true},
		{"4GiB", 4 << 30, true},
		{"4 GiB", 4 << 30, true},
		{"1.5GiB", 3 << 29, true},
		{"64KiB", 64 << 10, true},
		{"1TiB", 1 << 40, true},
		{"100B", 100, true},
		{"0", 0, true},
		{"", 0, false},
		{"4G", 0, false},
		{"4GB", 0, false},
		{"-1", 0, false},
		{"-1MiB", 0, false},
		{"1.5", 0, false},
		{"MiB", 0, false},
		{"99999999999TiB", 0, false},
		{"NaNGiB", 0, false},
	} {
		got, err := parseSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
	if s := formatSize(512 << 20); s != "512MiB" {
		t.Errorf("formatSize: %q", s)
	}
}

func TestServeResourceFlags(t *testing.T) {
	c, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := gateway.ResourceBounds{
		Default:   gateway.Resources{MemoryMiB: 512, CPUs: 1, Pids: 256, DiskMiB: 1024},
		DiskFixed: true,
	}
	if c.resources != want {
		t.Errorf("default bounds %+v, want %+v (caps left to the gateway: 4 x the defaults)", c.resources, want)
	}
	c, err = parseServe([]string{"--sandbox-memory", "1GiB", "--sandbox-max-memory=8GiB", "--sandbox-max-cpus", "8",
		"--sandbox-max-pids", "4096", "--sandbox-workspace-size", "2GiB", "--sandbox-max-disk", "16GiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.sandbox.limits.MemoryBytes != 1<<30 || c.sandbox.limits.WorkspaceBytes != 2<<30 {
		t.Errorf("driver limits %+v", c.sandbox.limits)
	}
	want = gateway.ResourceBounds{
		Default:   gateway.Resources{MemoryMiB: 1024, CPUs: 1, Pids: 256, DiskMiB: 2048},
		Max:       gateway.Resources{MemoryMiB: 8192, CPUs: 8, Pids: 4096, DiskMiB: 16384},
		DiskFixed: true,
	}
	if c.resources != want {
		t.Errorf("bounds %+v, want %+v", c.resources, want)
	}
	t.Setenv("SANDGATE_SANDBOX_MAX_MEMORY", "2GiB")
	if c, err := parseServe(nil, io.Discard); err != nil || c.resources.Max.MemoryMiB != 2048 {
		t.Errorf("from the environment: %v %+v", err, c)
	}
	for _, args := range [][]string{
		{"--sandbox-memory", "1GiB", "--sandbox-max-memory", "512MiB"},
		{"--sandbox-max-cpus", "0.5"},
		{"--sandbox-max-pids", "100"},
		{"--sandbox-max-disk", "100MiB"},
		{"--sandbox-memory", "4G"},
		{"--sandbox-memory", "1MiB"},
	} {
		if _, err := parseServe(args, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(args, " "))
		}
	}
}

// A requested diskMiB is the workspace's size on the linux driver, which
// sizes each sandbox's; on the workdir driver, which cannot, every session
// shows the default.
func TestServeDiskFixedPerDriver(t *testing.T) {
	c, err := parseServe([]string{"--sandbox-workspace-size", "256MiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := workdir.New(workdir.Config{Root: filepath.Join(t.TempDir(), "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	if b := forDriver(c.resources, wd); !b.DiskFixed || b.Default.DiskMiB != 256 {
		t.Errorf("workdir: %+v, want DiskFixed", b)
	}
	var linux sandbox.Driver = (*linuxns.Driver)(nil)
	if _, ok := linux.(workspaceSizer); !ok && runtime.GOOS == "linux" {
		t.Fatal("the linux driver does not size workspaces")
	}
	if runtime.GOOS == "linux" {
		if b := forDriver(c.resources, linux); b.DiskFixed || b.Default.DiskMiB != 256 {
			t.Errorf("linux: %+v, want DiskFixed false", b)
		}
	}
}

func TestServeWorkspaceLimitFlags(t *testing.T) {
	c, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.workspaces.maxWS != 100 || c.workspaces.maxSnaps != 1000 {
		t.Errorf("defaults %d, %d; want 100, 1000", c.workspaces.maxWS, c.workspaces.maxSnaps)
	}
	if c, err = parseServe([]string{"--max-workspaces-per-tenant", "3", "--max-snapshots-per-tenant=7"}, io.Discard); err != nil ||
		c.workspaces.maxWS != 3 || c.workspaces.maxSnaps != 7 {
		t.Errorf("set: %v %+v", err, c)
	}
	for _, args := range [][]string{
		{"--max-workspaces-per-tenant", "0"},
		{"--max-snapshots-per-tenant", "-1"},
	} {
		if _, err := parseServe(args, io.Discard); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%s: %v", strings.Join(args, " "), err)
		}
	}
}

// The warm pools of images: defaults, values, and the bounds' refusals.
func TestServeWarmImageFlags(t *testing.T) {
	c, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.sandbox; f.warmImageTTL != 10*time.Minute || f.warmImages != gateway.DefaultWarmPoolImages || f.warmMemory != gateway.DefaultWarmPoolMemory {
		t.Errorf("defaults: ttl %v, images %d, memory %d", f.warmImageTTL, f.warmImages, f.warmMemory)
	}
	c, err = parseServe([]string{"--warm-pool-image-ttl", "0", "--warm-pool-images", "8", "--warm-pool-memory", "1GiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.sandbox; f.warmImageTTL != 0 || f.warmImages != 8 || f.warmMemory != 1<<30 {
		t.Errorf("given: ttl %v, images %d, memory %d", f.warmImageTTL, f.warmImages, f.warmMemory)
	}
	for _, args := range [][]string{
		{"--warm-pool-image-ttl", "-1s"},
		{"--warm-pool-images", "0"},
		{"--warm-pool-images", "65"},
		{"--warm-pool-memory", "-1"},
	} {
		if _, err := parseServe(args, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(args, " "))
		}
	}
}

// TestServeWarmPoolFlag: --warm-pool is auto unless given (four
// sandboxes per GiB of the host's memory, rounded, 8 to 64, on the linux
// driver; none on workdir), takes a number or auto, and refuses the rest.
func TestServeWarmPoolFlag(t *testing.T) {
	for _, c := range []struct {
		mem  uint64
		want int
	}{{0, 8}, {1 << 30, 8}, {2 << 30, 8}, {4 << 30, 16}, {8 << 30, 32}, {16<<30 - 400<<20, 64}, {16 << 30, 64}, {1 << 40, 64}} {
		if got := autoWarmPoolFor(c.mem); got != c.want {
			t.Errorf("auto pool with %d bytes of memory: %d, want %d", c.mem, got, c.want)
		}
	}
	linux, workdir := namedDriver("linux"), namedDriver("workdir")
	c, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.sandbox.warmPoolFor(linux), autoWarmPoolFor(hostMemory()); got != want || got < minAutoWarmPool {
		t.Errorf("default pool on linux: %d, want %d", got, want)
	}
	if got := c.sandbox.warmPoolFor(workdir); got != 0 {
		t.Errorf("default pool on workdir: %d, want 0", got)
	}
	for _, v := range []struct {
		arg  string
		want int
	}{{"0", 0}, {"3", 3}, {"64", 64}, {"auto", autoWarmPoolFor(hostMemory())}} {
		c, err := parseServe([]string{"--warm-pool", v.arg}, io.Discard)
		if err != nil {
			t.Errorf("--warm-pool %s: %v", v.arg, err)
			continue
		}
		if got := c.sandbox.warmPoolFor(linux); got != v.want {
			t.Errorf("--warm-pool %s: %d, want %d", v.arg, got, v.want)
		}
	}
	for _, arg := range []string{"-1", "65", "many", ""} {
		if _, err := parseServe([]string{"--warm-pool", arg}, io.Discard); err == nil || !strings.Contains(err.Error(), "warm-pool") {
			t.Errorf("--warm-pool %q: %v, want a refusal naming the flag", arg, err)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	registerSandboxFlags(fs)
	if f := fs.Lookup("warm-pool"); f == nil || f.DefValue != "auto" {
		t.Errorf("--warm-pool's default as help shows it: %+v, want auto", f)
	}
}

// namedDriver is a sandbox.Driver that only has a name.
type namedDriver string

func (d namedDriver) Name() string { return string(d) }

func (namedDriver) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return nil, errors.ErrUnsupported
}

// TestServerTimingHelp: --server-timing's help names every answer it
// times: a create's, a fork's and a command's.
func TestServerTimingHelp(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	registerSandboxFlags(fs)
	f := fs.Lookup("server-timing")
	if f == nil {
		t.Fatal("no --server-timing flag")
	}
	for _, want := range []string{"POST /v1/sessions", "fork", "command"} {
		if !strings.Contains(f.Usage, want) {
			t.Errorf("--server-timing's help does not mention %q: %s", want, f.Usage)
		}
	}
}
