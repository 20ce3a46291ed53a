package dataplane

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// sessionStored is what the session's listed processes keep.
func sessionStored(ps *Processes, id string) int64 {
	sp := ps.lookup(id)
	if sp == nil {
		return 0
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var n int64
	for _, p := range sp.procs {
		n += p.out.Stored()
	}
	return n
}

// TestSessionDiskChargeExact: processes writing at once into a small
// session quota (the workspace sampled meanwhile) leave the session's
// charge equal to what its outputs keep, within the quota; so does the
// next gateway that takes the processes back; and nothing stays charged
// once the session ends.
func TestSessionDiskChargeExact(t *testing.T) {
	dir := t.TempDir()
	mgr, _ := newManagedSession(t, "workdir")
	ctx := context.Background()
	disk := int64(gateway.MinDiskMiB)
	s, _, err := mgr.Create(ctx, gateway.Principal{Tenant: "t"}, gateway.CreateParams{Resources: &gateway.ResourceRequest{DiskMiB: &disk}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ProcessConfig{StateDir: dir, OutputCap: 8 << 20}
	ps := &Processes{}
	var procs []*Process
	for range 4 {
		info, err := ps.Start(ctx, s, cfg, StartRequest{Command: "head -c 6000000 /dev/zero"})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := ps.Get(s.ID, info.ProcessID)
		procs = append(procs, p)
	}
	for _, p := range procs {
		select {
		case <-p.Done():
		case <-time.After(60 * time.Second):
			t.Fatal("a process did not end")
		}
	}
	quota := disk << 20
	cut := 0
	for _, p := range procs {
		info := p.Info()
		if info.OutputTruncated != "" || info.OutputStartOffset > 0 {
			cut++
		}
	}
	if cut == 0 {
		t.Fatalf("24 MB of output on a %d-byte quota: none dropped or truncated", quota)
	}
	if got, kept := ps.DiskBytes(s.ID), sessionStored(ps, s.ID); got != kept || got > quota || got == 0 {
		t.Fatalf("charged %d, the outputs keep %d (quota %d)", got, kept, quota)
	}
	// The next gateway takes them back, charged as they are.
	ps2 := &Processes{}
	if _, err := ps2.session(s, cfg); err != nil {
		t.Fatal(err)
	}
	if got, kept := ps2.DiskBytes(s.ID), sessionStored(ps2, s.ID); got != kept || got == 0 {
		t.Fatalf("after a restart: charged %d, the outputs keep %d", got, kept)
	}
	if err := mgr.Delete(ctx, gateway.Principal{Tenant: "t"}, s.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Processes{ps, ps2} {
		if got := p.DiskBytes(s.ID); got != 0 {
			t.Errorf("after the session ended: %d charged", got)
		}
	}
}
