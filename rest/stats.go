package rest

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// statsTimeout bounds the sampling of a session's usage (the workdir
// driver walks its directory).
const statsTimeout = 5 * time.Second

// statsJSON is the answer of GET /v1/sessions/{id}/stats. A group the
// sandbox driver cannot measure is absent (the workdir driver knows only
// its disk use; a stopped session has no memory, CPU or pids to measure).
type statsJSON struct {
	SessionID string       `json:"sessionId"`
	Status    string       `json:"status"`
	SampledAt time.Time    `json:"sampledAt"`
	Memory    *memoryStats `json:"memory,omitempty"`
	CPU       *cpuStats    `json:"cpu,omitempty"`
	Pids      *pidsStats   `json:"pids,omitempty"`
	Disk      *diskStats   `json:"disk,omitempty"`
	Tunnel    byteCounts   `json:"tunnel"`
	Egress    byteCounts   `json:"egress"`
}

type memoryStats struct {
	CurrentBytes int64  `json:"currentBytes"`
	PeakBytes    *int64 `json:"peakBytes,omitempty"`
	LimitBytes   *int64 `json:"limitBytes,omitempty"`
}

type cpuStats struct {
	Seconds float64  `json:"seconds"`
	Limit   *float64 `json:"limit,omitempty"` // cores
}

type pidsStats struct {
	Current int64  `json:"current"`
	Limit   *int64 `json:"limit,omitempty"`
}

type diskStats struct {
	// UsedBytes is what the workspace's files use plus
	// ProcessOutputBytes, the background processes' output kept on the
	// host, which counts against the same quota.
	UsedBytes          int64  `json:"usedBytes"`
	TotalBytes         *int64 `json:"totalBytes,omitempty"`
	ProcessOutputBytes int64  `json:"processOutputBytes"`
}

type byteCounts struct {
	BytesIn  int64 `json:"bytesIn"`
	BytesOut int64 `json:"bytesOut"`
}

// sessionStats serves GET /v1/sessions/{id}/stats: the session's live
// resource use. Reading it is not activity (a dashboard polling it keeps
// no session alive); another tenant's session is a 404, like a missing one.
func (a *api) sessionStats(w http.ResponseWriter, r *http.Request) {
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	if !s.Live() {
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running, so it uses nothing; delete it")
		return
	}
	snap := s.Snapshot()
	out := statsJSON{SessionID: s.ID, Status: snap.Status, SampledAt: time.Now().UTC()}
	out.Tunnel.BytesIn, out.Tunnel.BytesOut = s.TunnelBytes()
	if e := snap.Egress; e != nil {
		out.Egress = byteCounts{BytesIn: e.BytesIn, BytesOut: e.BytesOut}
	}
	if st, ok := sandbox.As[sandbox.Statser](s.Sandbox()); ok {
		ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
		u, err := st.Stats(ctx)
		cancel()
		switch {
		case errors.Is(err, sandbox.ErrClosed):
			WriteError(w, http.StatusConflict, "session_not_running", "the session's sandbox is gone; delete it")
			return
		case err != nil:
			a.cfg.Log.Warn("session_stats_failed", "session", s.ID, "err", err)
			WriteError(w, http.StatusServiceUnavailable, "stats_unavailable", "the session's usage could not be read now; retry")
			return
		}
		fillStats(&out, u, s.Resources)
	}
	if n := a.dp.Processes.DiskBytes(s.ID); n > 0 {
		if out.Disk == nil {
			out.Disk = &diskStats{}
		}
		out.Disk.UsedBytes += n
		out.Disk.ProcessOutputBytes = n
	}
	_ = WriteJSON(w, http.StatusOK, out)
}

// fillStats puts u, and the session's limits res (nil: unknown), in out.
func fillStats(out *statsJSON, u sandbox.Stats, res *gateway.Resources) {
	if res == nil {
		res = &gateway.Resources{}
	}
	positive := func(n int64) *int64 {
		if n <= 0 {
			return nil
		}
		return &n
	}
	if u.MemoryBytes != nil {
		out.Memory = &memoryStats{CurrentBytes: *u.MemoryBytes, PeakBytes: u.MemoryPeakBytes, LimitBytes: positive(res.MemoryMiB << 20)}
	}
	if u.CPUSeconds != nil {
		out.CPU = &cpuStats{Seconds: *u.CPUSeconds}
		if res.CPUs > 0 {
			out.CPU.Limit = &res.CPUs
		}
	}
	if u.Pids != nil {
		out.Pids = &pidsStats{Current: *u.Pids, Limit: positive(res.Pids)}
	}
	if u.DiskUsedBytes != nil {
		out.Disk = &diskStats{UsedBytes: *u.DiskUsedBytes, TotalBytes: u.DiskTotalBytes}
	}
}
