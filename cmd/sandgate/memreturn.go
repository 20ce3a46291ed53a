package main

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// After a burst of work (a churn of creates and deletes allocates
// hundreds of MiB in all) the Go runtime keeps the heap it grew to as
// free pages, handing them back to the host only slowly: the soak saw
// the gateway's RSS stay 12-50% over its level before 1,000 sessions,
// with the same live heap, the difference being free heap not yet
// released. So once the gateway is quiet (it allocated less than
// memQuietBytes in the last memReturnEvery) and holds at least
// memFreeBytes of such free heap, or as much garbage (objects the last
// collection would not keep: with the heap governor's GOGC of 400 on a
// small heap, an idle gateway that allocates a little, a scrape or a
// list a second, grows its heap to five times what it keeps before the
// next collection), it collects and releases it to the host (for the
// sandboxes). Busy, the runtime's own scavenger paces it.
const (
	memReturnEvery = 5 * time.Second
	memQuietBytes  = 16 << 20
	memFreeBytes   = 4 << 20
)

// returnMemory runs until ctx ends.
func returnMemory(ctx context.Context, log *slog.Logger) {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	read := func() (allocs, free, live uint64) {
		metrics.Read(sample)
		var v [4]uint64
		for i := range sample {
			if sample[i].Value.Kind() == metrics.KindUint64 {
				v[i] = sample[i].Value.Uint64()
			}
		}
		// Free pages, and garbage: the heap's objects over what the last
		// collection marked live.
		free = v[1]
		if v[2] > v[3] {
			free += v[2] - v[3]
		}
		return v[0], free, v[3]
	}
	last, _, _ := read()
	t := time.NewTicker(memReturnEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, free, live := read()
		if shouldReturn(now-last, free, live) {
			start := time.Now()
			debug.FreeOSMemory()
			log.Debug("memory_returned", "free_heap_bytes", free, "live_heap_bytes", live,
				"took", time.Since(start).Round(time.Microsecond).String())
			now, _, _ = read()
		}
		last = now
	}
}

// shouldReturn says whether a gateway that allocated allocated bytes in
// the last memReturnEvery, holding free bytes of free heap and garbage
// and a live heap of live bytes, collects and returns memory now: when
// it is quiet and holds at least memFreeBytes, and a quarter of its live
// heap (a forced collection costs CPU in proportion to the live heap: a
// large one is collected no more often than the runtime would at GOGC 25).
func shouldReturn(allocated, free, live uint64) bool {
	return allocated < memQuietBytes && free >= max(memFreeBytes, live/4)
}
