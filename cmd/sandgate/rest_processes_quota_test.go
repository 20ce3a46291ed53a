package main

import (
	"io/fs"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestRESTProcessOutputDiskQuota: the output that a session's background
// processes keep on the host counts against the session's disk quota.
// Twenty processes printing 15 MB each on a session of 64 MiB put no more
// than the quota on the host's disk (old code: 300 MB); the session's
// stats show the output in its disk use; room is made by dropping the
// output of the processes that ended first (they stay listed), also when
// the workspace's files grow into what the output keeps; the
// processes whose output still had no room run to their end, and say why
// their output was cut (outputTruncated disk_full, in their info and in
// their output stream).
func TestRESTProcessOutputDiskQuota(t *testing.T) {
	requireLinuxDriver(t)
	const quota = 64 << 20
	g := startGateway(t, "--sandbox", "linux")
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"resources": map[string]any{"diskMiB": quota >> 20}}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	pc := procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}
	const n, each = 20, 15_000_000
	ids := make([]string, n)
	// They all start writing at once (when ./go appears), so the quota
	// fills while every one of them runs.
	for i := range ids {
		ids[i] = pc.start(t, map[string]any{"command": "while [ ! -e go ]; do sleep 0.05; done; yes 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde | head -c " + strconv.Itoa(each)}).ProcessID
	}
	pc.start(t, map[string]any{"command": "touch go"})
	type info struct {
		Status               string `json:"status"`
		ExitCode             *int   `json:"exitCode"`
		OutputBytes          int64  `json:"outputBytes"`
		OutputStartOffset    int64  `json:"outputStartOffset"`
		OutputTruncated      string `json:"outputTruncated"`
		OutputDiscardedBytes int64  `json:"outputDiscardedBytes"`
	}
	var kept int64
	truncated := ""
	for _, id := range ids {
		pc.waitEnd(t, id)
		var p info
		if code := g.api(t, http.MethodGet, pc.base+"/"+id, nil, &p); code != http.StatusOK {
			t.Fatalf("get %s: %d", id, code)
		}
		if p.ExitCode == nil || *p.ExitCode != 0 {
			t.Errorf("process %s: %+v, want it run to its end (exit 0) whatever its output", id, p)
		}
		if p.OutputTruncated != "" {
			if p.OutputTruncated != "disk_full" || p.OutputBytes+p.OutputDiscardedBytes != each {
				t.Errorf("process %s: %+v, want outputTruncated disk_full and kept+discarded = %d", id, p, each)
			}
			truncated = id
		} else if p.OutputBytes != each {
			t.Errorf("process %s kept %d bytes, not truncated: want all %d", id, p.OutputBytes, each)
		}
	}
	// What they keep, once all have ended (a later one may have dropped
	// an earlier one's output).
	var list struct {
		Processes []info `json:"processes"`
	}
	if code := g.api(t, http.MethodGet, pc.base, nil, &list); code != http.StatusOK || len(list.Processes) != n+1 {
		t.Fatalf("list: %d, %d processes", code, len(list.Processes))
	}
	for _, p := range list.Processes {
		kept += p.OutputBytes - p.OutputStartOffset
	}
	if truncated == "" {
		t.Fatalf("no process's output was truncated: %d bytes kept on a %d-byte quota", kept, quota)
	}

	// What the host's disk holds for the session's output.
	outputOnDisk := func() int64 {
		var onDisk int64
		_ = filepath.WalkDir(filepath.Join(g.DataDir, "dataplane", s.SessionID), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				var st syscall.Stat_t
				if syscall.Stat(path, &st) == nil {
					onDisk += st.Blocks * 512
				}
			}
			return nil
		})
		return onDisk
	}
	type diskStats struct {
		UsedBytes          int64  `json:"usedBytes"`
		TotalBytes         *int64 `json:"totalBytes"`
		ProcessOutputBytes int64  `json:"processOutputBytes"`
	}
	diskNow := func() diskStats {
		var stats struct {
			Disk *diskStats `json:"disk"`
		}
		if code := g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/stats", nil, &stats); code != http.StatusOK || stats.Disk == nil || stats.Disk.TotalBytes == nil {
			t.Fatalf("stats: %d %+v", code, stats.Disk)
		}
		return *stats.Disk
	}
	onDisk, d := outputOnDisk(), diskNow()
	t.Logf("%d processes x %d bytes: %d kept, %d bytes on the host's disk; stats: used %d (output %d) of %d",
		n, each, kept, onDisk, d.UsedBytes, d.ProcessOutputBytes, *d.TotalBytes)
	if onDisk > quota {
		t.Errorf("the session's process output takes %d bytes on the host's disk, past its %d-byte quota", onDisk, quota)
	}
	// Frames' headers (5 bytes in 64 KiB) aside, the stats count what is kept.
	if d.ProcessOutputBytes < kept || d.ProcessOutputBytes > kept+kept/1000+4096 {
		t.Errorf("stats count %d bytes of process output, the processes keep %d", d.ProcessOutputBytes, kept)
	}
	if d.UsedBytes < d.ProcessOutputBytes || d.UsedBytes > *d.TotalBytes {
		t.Errorf("stats: used %d bytes (output %d) of %d: want the output counted, within the quota", d.UsedBytes, d.ProcessOutputBytes, *d.TotalBytes)
	}

	// The output stream of a truncated process says so where it stops.
	lines, cancel := pc.output(t, truncated, 0, false)
	defer cancel()
	said := false
	for l := range lines {
		if l.Truncated == "disk_full" {
			said = true
		}
	}
	if !said {
		t.Errorf("the output stream of %s has no line truncated: disk_full", truncated)
	}
	// The workspace's files grow into what the output keeps: output
	// written after the next sample of the workspace (at most every
	// 0.5 s) drops the output of the processes that ended first, so the
	// two together come back within the quota.
	grow := pc.start(t, map[string]any{"command": "head -c 30000000 /dev/zero > grow.bin && sync && while true; do echo tick; sleep 0.2; done"})
	var after diskStats
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = diskNow()
		if after.UsedBytes <= *after.TotalBytes && after.ProcessOutputBytes < d.ProcessOutputBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the workspace grew: used %d (output %d, was %d) of %d; want the output dropped to fit", after.UsedBytes, after.ProcessOutputBytes, d.ProcessOutputBytes, *after.TotalBytes)
		}
	}
	t.Logf("after 30 MB of files: used %d (output %d, %d on the host's disk) of %d", after.UsedBytes, after.ProcessOutputBytes, outputOnDisk(), *after.TotalBytes)
	if code := g.api(t, http.MethodPost, pc.base+"/"+grow.ProcessID+"/signal", map[string]any{"signal": "KILL"}, nil); code != http.StatusNoContent {
		t.Fatalf("signal: %d", code)
	}
	pc.waitEnd(t, grow.ProcessID)
	if code := g.api(t, http.MethodGet, pc.base, nil, &list); code != http.StatusOK || len(list.Processes) != n+2 {
		t.Fatalf("list: %d, %d processes", code, len(list.Processes))
	}
	dropped := 0
	for _, p := range list.Processes {
		if p.OutputBytes > 0 && p.OutputStartOffset == p.OutputBytes {
			dropped++
		}
	}
	if dropped == 0 {
		t.Errorf("no process is listed with its output dropped: %+v", list.Processes)
	}
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
}
