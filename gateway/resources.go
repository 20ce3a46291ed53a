package gateway

import (
	"fmt"
	"math"
	"strconv"

	"github.com/sandgate/sandgate/sandbox"
)

// Resources are a session's sandbox limits in the API's units.
type Resources struct {
	MemoryMiB int64   `json:"memoryMiB"`
	CPUs      float64 `json:"cpus"`
	Pids      int64   `json:"pids"`
	DiskMiB   int64   `json:"diskMiB"`
}

// ResourceRequest is what a create asks for; each nil field is the
// gateway's default.
type ResourceRequest struct {
	MemoryMiB *int64   `json:"memoryMiB"`
	CPUs      *float64 `json:"cpus"`
	Pids      *int64   `json:"pids"`
	DiskMiB   *int64   `json:"diskMiB"`
}

// ResourceBounds are a gateway's defaults and caps for session resources.
type ResourceBounds struct {
	// Default is what an omitted field gets (zero fields: the sandbox
	// package's defaults).
	Default Resources
	// Max caps requests (zero fields: 4 times the default).
	Max Resources
	// DiskFixed says every workspace has the default size whatever a
	// create asks (the workdir driver): a requested diskMiB is still
	// checked against the cap, and the session shows the size in force.
	DiskFixed bool
}

// Lower bounds of a resource request: below them a sandbox cannot start a
// shell reliably.
const (
	MinMemoryMiB = 32
	MinCPUs      = 0.01
	MinPids      = 8
	MinDiskMiB   = 16
)

const mib = 1 << 20

// MaxPids is the most pids a session may ask for, defaults applied.
func (b ResourceBounds) MaxPids() int64 { return b.withDefaults().Max.Pids }

// withDefaults fills b's zero fields.
func (b ResourceBounds) withDefaults() ResourceBounds {
	d := &b.Default
	if d.MemoryMiB <= 0 {
		d.MemoryMiB = sandbox.DefaultMemoryBytes / mib
	}
	if d.CPUs <= 0 {
		d.CPUs = sandbox.DefaultCPUs
	}
	if d.Pids <= 0 {
		d.Pids = sandbox.DefaultPids
	}
	if d.DiskMiB <= 0 {
		d.DiskMiB = sandbox.DefaultWorkspaceBytes / mib
	}
	m := &b.Max
	if m.MemoryMiB <= 0 {
		m.MemoryMiB = 4 * d.MemoryMiB
	}
	if m.CPUs <= 0 {
		m.CPUs = 4 * d.CPUs
	}
	if m.Pids <= 0 {
		m.Pids = 4 * d.Pids
	}
	if m.DiskMiB <= 0 {
		m.DiskMiB = 4 * d.DiskMiB
	}
	return b
}

// resolve turns a request into the resources in force: defaults for
// omitted fields, each field within its minimum (invalid_resources) and
// the gateway's cap (resources_exceeded, naming the limit).
func (b ResourceBounds) resolve(req *ResourceRequest) (Resources, error) {
	r := b.Default
	if req == nil {
		return r, nil
	}
	type field struct {
		name      string
		got       *float64
		min, max  float64
		unit, cap string
	}
	f := func(p *int64) *float64 {
		if p == nil {
			return nil
		}
		v := float64(*p)
		return &v
	}
	// num shows a bound or a cpus value: whole numbers as integers.
	num := func(v float64) string {
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return strconv.FormatInt(int64(v), 10)
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	fields := []field{
		{"memoryMiB", f(req.MemoryMiB), MinMemoryMiB, float64(b.Max.MemoryMiB), " MiB", "sandbox-max-memory"},
		{"cpus", req.CPUs, MinCPUs, b.Max.CPUs, "", "sandbox-max-cpus"},
		{"pids", f(req.Pids), MinPids, float64(b.Max.Pids), "", "sandbox-max-pids"},
		{"diskMiB", f(req.DiskMiB), MinDiskMiB, float64(b.Max.DiskMiB), " MiB", "sandbox-max-disk"},
	}
	ints := map[string]*int64{"memoryMiB": req.MemoryMiB, "pids": req.Pids, "diskMiB": req.DiskMiB}
	for _, x := range fields {
		if x.got == nil {
			continue
		}
		got := num(*x.got)
		if p := ints[x.name]; p != nil {
			got = strconv.FormatInt(*p, 10) // exact: a float64 rounds past 2^53
		}
		if *x.got < x.min {
			return Resources{}, Invalid("invalid_resources", fmt.Sprintf("resources.%s must be at least %s%s, got %s", x.name, num(x.min), x.unit, got))
		}
		if *x.got > x.max {
			return Resources{}, Invalid("resources_exceeded", fmt.Sprintf(
				"resources.%s is %s%s, above this gateway's limit of %s%s (%s)", x.name, got, x.unit, num(x.max), x.unit, x.cap))
		}
	}
	if req.MemoryMiB != nil {
		r.MemoryMiB = *req.MemoryMiB
	}
	if req.CPUs != nil {
		r.CPUs = *req.CPUs
	}
	if req.Pids != nil {
		r.Pids = *req.Pids
	}
	if req.DiskMiB != nil && !b.DiskFixed {
		r.DiskMiB = *req.DiskMiB
	}
	return r, nil
}

// limits are the fields req sets as a driver's per-sandbox limits; the
// fields it leaves out are zero, which a driver fills with its own
// defaults (those the gateway's defaults describe).
func (b ResourceBounds) limits(req *ResourceRequest) sandbox.Limits {
	var l sandbox.Limits
	if req == nil {
		return l
	}
	if req.MemoryMiB != nil {
		l.MemoryBytes = *req.MemoryMiB * mib
	}
	if req.CPUs != nil {
		l.CPUs = *req.CPUs
	}
	if req.Pids != nil {
		l.Pids = *req.Pids
	}
	if req.DiskMiB != nil && !b.DiskFixed {
		l.WorkspaceBytes = *req.DiskMiB * mib
	}
	return l
}
