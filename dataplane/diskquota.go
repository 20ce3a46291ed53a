package dataplane

import (
	"context"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// TruncatedDiskFull is the reason (ProcessInfo.OutputTruncated) a
// process's output stopped being kept: the session's disk quota had no
// room for it.
const TruncatedDiskFull = "disk_full"

// diskSampleEvery is how often, at most, a session's workspace usage is
// sampled while its processes write output; a sample that takes long
// (the workdir driver walks its directory) spaces the next ones out, to
// diskSampleCost times its length.
const (
	diskSampleEvery = 500 * time.Millisecond
	diskSampleCost  = 20
	diskSampleMax   = 10 * time.Second
)

// diskSampleTimeout bounds one sample (the workdir driver walks its
// directory).
const diskSampleTimeout = 5 * time.Second

// sessionDisk charges the output that a session's background processes
// keep on the host (under ProcessConfig.StateDir) to the session's disk
// quota, the size of its workspace: the output kept, plus what the
// workspace's files use, stays within it. Output is counted exactly;
// the workspace's use is sampled (diskSampleEvery), so files written
// meanwhile may take it past for that long. It is an OutputLog's Quota.
type sessionDisk struct {
	// sample reads the workspace's use and size; ok false keeps what
	// was known.
	sample func(ctx context.Context) (used, total int64, ok bool)

	mu       sync.Mutex
	charged  int64 // bytes the session's outputs store
	used     int64 // the workspace's, last sampled
	total    int64 // the quota (0: none known, nothing refused)
	sampled  time.Time
	every    time.Duration // the wait before the next sample
	sampling bool
}

// newSessionDisk is s's disk quota: its workspace's size (as its sandbox
// tells, else the diskMiB it was given), less what the workspace uses.
func newSessionDisk(s *gateway.Session) *sessionDisk {
	var given int64
	if s.Resources != nil {
		given = s.Resources.DiskMiB << 20
	}
	d := &sessionDisk{total: given}
	d.sample = func(ctx context.Context) (used, total int64, ok bool) {
		total = given
		sb := s.Sandbox()
		if sb == nil {
			return 0, 0, false
		}
		st, ok := sandbox.As[sandbox.Statser](sb)
		if !ok {
			return 0, total, true
		}
		u, err := st.Stats(ctx)
		if err != nil {
			return 0, 0, false
		}
		if u.DiskTotalBytes != nil && *u.DiskTotalBytes > 0 {
			total = *u.DiskTotalBytes
		}
		if u.DiskUsedBytes != nil {
			used = *u.DiskUsedBytes
		}
		return used, total, true
	}
	return d
}

// refresh samples the workspace's use when the last sample is older than
// diskSampleEvery and no other caller is sampling. It does I/O: callers
// hold no lock.
func (d *sessionDisk) refresh() {
	d.mu.Lock()
	if d.sampling || time.Since(d.sampled) < d.every {
		d.mu.Unlock()
		return
	}
	d.sampling = true
	d.mu.Unlock()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), diskSampleTimeout)
	used, total, ok := d.sample(ctx)
	cancel()
	took := time.Since(start)
	d.mu.Lock()
	d.sampling, d.sampled = false, time.Now()
	d.every = min(max(diskSampleEvery, diskSampleCost*took), diskSampleMax)
	if ok {
		d.used, d.total = used, total
	}
	d.mu.Unlock()
}

// over reports whether the output charged and the workspace's use, as
// last sampled, are past the quota: the workspace grew since the output
// was kept.
func (d *sessionDisk) over() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total > 0 && d.used+d.charged > d.total
}

// Take implements Quota.
func (d *sessionDisk) Take(n int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.total > 0 && d.used+d.charged+n > d.total {
		return false
	}
	d.charged += n
	return true
}

// Give implements Quota.
func (d *sessionDisk) Give(n int64) {
	d.mu.Lock()
	d.charged -= n
	d.mu.Unlock()
}

// Force implements Quota.
func (d *sessionDisk) Force(n int64) {
	d.mu.Lock()
	d.charged += n
	d.mu.Unlock()
}

// Charged is the bytes the session's outputs store.
func (d *sessionDisk) Charged() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.charged
}

// DiskBytes is how many bytes the output of session id's background
// processes takes on the host, which counts against the session's disk
// quota (GET /v1/sessions/{id}/stats adds it to the workspace's use);
// 0 when it keeps none, or keeps it in memory.
func (ps *Processes) DiskBytes(sessionID string) int64 {
	sp := ps.lookup(sessionID)
	if sp == nil || sp.disk == nil {
		return 0
	}
	return sp.disk.Charged()
}
