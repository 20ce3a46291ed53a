package linuxns

import (
	"os/exec"
	"testing"
	"time"
)

// TestLazyDaemonsBehindRestores: a lazy-pages daemon that listens while
// other restores of its checkpoint are under way (Restore calls holdBack
// then, and again once its own restore is done) runs at lazyNice until
// the last of them is done (or lazyBehindMax has passed), then at the
// gateway's priority; one whose restore was the only one under way is
// left alone, and so is one that ended (its pid may be another process's
// by then). A daemon is held back once: not again after lazyBehindMax
// let it go. Real processes stand in for the daemons.
func TestLazyDaemonsBehindRestores(t *testing.T) {
	requireRoot(t, "giving a process its priority back takes CAP_SYS_NICE")
	own, err := niceOf(0)
	if err != nil {
		t.Fatal(err)
	}
	if own >= lazyNice {
		t.Skipf("the test runs at nice %d already", own)
	}
	start := func() (*lazyPages, int) {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return &lazyPages{}, cmd.Process.Pid
	}
	nice := func(pid int) int {
		t.Helper()
		n, err := niceOf(pid)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	c := &checkpoint{}
	la, a := start()
	lb, b := start()
	lgone, gone := start()
	c.restoreBegins()
	c.restoreBegins()
	c.restoreBegins() // a fork ×3
	c.lazyStarted(la, a)
	c.lazyStarted(lb, b)
	c.lazyStarted(lgone, gone)
	if n := nice(a); n != own {
		t.Errorf("daemon before it listens: nice %d, want the gateway's %d", n, own)
	}
	c.holdBack(la) // it listens, two other restores are under way
	if n := nice(a); n != lazyNice {
		t.Errorf("daemon listening while other restores run: nice %d, want %d", n, lazyNice)
	}
	c.holdBack(la) // its restore is done, two others are not
	c.restoreDone()
	c.holdBack(lgone)
	c.lazyExited(lgone) // its pid is let go before it is reaped
	c.restoreDone()
	if n := nice(a); n != lazyNice {
		t.Errorf("daemon done while other restores run: nice %d, want %d", n, lazyNice)
	}
	c.holdBack(lb) // the last restore's: none other under way
	if n := nice(b); n != own {
		t.Errorf("daemon of the last restore: nice %d, want the gateway's %d", n, own)
	}
	c.restoreDone()
	if n := nice(a); n != own {
		t.Errorf("daemon after the restores: nice %d, want the gateway's %d", n, own)
	}
	if n := nice(gone); n != lazyNice {
		t.Errorf("a daemon that exited was given its priority back (nice %d): its pid is no longer its own", n)
	}
	if len(c.behind) != 0 || c.behindTimer != nil {
		t.Errorf("daemons still held back after the restores: %v", c.behind)
	}

	// A restore that takes long does not hold the others' daemons back
	// for more than lazyBehindMax.
	lc, pc := start()
	c.restoreBegins()
	c.restoreBegins()
	c.lazyStarted(lc, pc)
	c.holdBack(lc) // it listens
	if n := nice(pc); n != lazyNice {
		t.Fatalf("daemon listening while another restore runs: nice %d, want %d", n, lazyNice)
	}
	deadline := time.Now().Add(lazyBehindMax + 10*time.Second)
	for nice(pc) != own && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := nice(pc); n != own {
		t.Errorf("daemon held back past lazyBehindMax: nice %d, want the gateway's %d", n, own)
	}
	c.holdBack(lc) // its restore is done at last, the other one still runs
	if n := nice(pc); n != own {
		t.Errorf("daemon let go at lazyBehindMax was held back again once its restore was done: nice %d", n)
	}
	c.restoreDone()
	c.restoreDone()
}
