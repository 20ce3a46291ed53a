package sandbox

import "context"

// Statser is implemented by sandboxes that can tell their live resource
// use (linuxns: from the sandbox's cgroups and its workspace filesystem;
// workdir: the disk use of its directory only). The REST API's
// GET /v1/sessions/{id}/stats shows it.
type Statser interface {
	// Stats samples the sandbox's resource use now. A field the driver
	// cannot tell is nil; an error means nothing could be read.
	Stats(ctx context.Context) (Stats, error)
}

// Stats is a sandbox's resource use at one moment. Nil fields are unknown
// to the driver (or, for a stopped sandbox, have nothing to measure: it
// has no processes and no cgroups).
type Stats struct {
	// MemoryBytes is the memory the sandbox's processes use now, as their
	// cgroup counts it (page cache included); MemoryPeakBytes the most
	// they used since the sandbox (or its last resume) started.
	MemoryBytes, MemoryPeakBytes *int64
	// CPUSeconds is the CPU time the sandbox's processes used (user and
	// system, all CPUs), since the sandbox (or its last resume) started.
	CPUSeconds *float64
	// Pids is how many processes and threads the sandbox has now.
	Pids *int64
	// DiskUsedBytes is what the session's files take; DiskTotalBytes the
	// size of its workspace filesystem, when it has a size of its own.
	DiskUsedBytes, DiskTotalBytes *int64
}

// As finds the optional interface T behind sb: sb itself, or what its
// wrappers' Unwrap() Sandbox return (the gateway wraps each session's
// sandbox). ok is false when nothing on the way implements T.
func As[T any](sb Sandbox) (t T, ok bool) {
	for sb != nil {
		if t, ok = sb.(T); ok {
			return t, true
		}
		u, isWrapper := sb.(interface{ Unwrap() Sandbox })
		if !isWrapper {
			break
		}
		sb = u.Unwrap()
	}
	return t, false
}
