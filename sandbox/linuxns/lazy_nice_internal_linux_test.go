package linuxns

import (
	"os/exec"
	"testing"
)

// TestLazyDaemonsBehindRestores: a lazy-pages daemon started while
// restores of its checkpoint are under way runs at lazyNice until the last
// of them is done, then at the gateway's priority; one started with none
// under way, or one that ended, is left alone (its pid may be another
// process's by then). Real processes stand in for the daemons.
func TestLazyDaemonsBehindRestores(t *testing.T) {
	own, err := niceOf(0)
	if err != nil {
		t.Fatal(err)
	}
	if own >= lazyNice {
		t.Skipf("the test runs at nice %d already", own)
	}
	start := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	nice := func(cmd *exec.Cmd) int {
		t.Helper()
		n, err := niceOf(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	c := &checkpoint{}
	a, b, late, gone := start(), start(), start(), start()
	la, lb, llate, lgone := &lazyPages{}, &lazyPages{}, &lazyPages{}, &lazyPages{}

	c.restoreBegins()
	c.restoreBegins() // a fork ×2
	c.lazyStarted(la, a.Process.Pid)
	c.lazyStarted(lb, b.Process.Pid)
	c.lazyStarted(lgone, gone.Process.Pid)
	for _, cmd := range []*exec.Cmd{a, b, gone} {
		if n := nice(cmd); n != lazyNice {
			t.Errorf("daemon %d started during the restores: nice %d, want %d", cmd.Process.Pid, n, lazyNice)
		}
	}
	c.lazyExited(lgone) // its pid is let go before it is reaped
	c.restoreDone()
	if n := nice(a); n != lazyNice {
		t.Errorf("daemon after the first of two restores: nice %d, want %d until the second is done", n, lazyNice)
	}
	c.restoreDone()
	for _, cmd := range []*exec.Cmd{a, b} {
		if n := nice(cmd); n != own {
			t.Errorf("daemon %d after the restores: nice %d, want the gateway's %d", cmd.Process.Pid, n, own)
		}
	}
	if n := nice(gone); n != lazyNice {
		t.Errorf("a daemon that exited was given its priority back (nice %d): its pid is no longer its own", n)
	}
	if len(c.behind) != 0 {
		t.Errorf("daemons still held back after the restores: %v", c.behind)
	}
	c.lazyStarted(llate, late.Process.Pid)
	if n := nice(late); n != own {
		t.Errorf("daemon started with no restore under way: nice %d, want %d", n, own)
	}
}
