package linuxns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// A fork's restore copies its processes' memory on demand (CRIU's lazy
// pages): criu restores everything but the private anonymous memory,
// whose areas it registers with a userfaultfd of each restored process;
// a "criu lazy-pages" daemon, reading the same images, answers each
// fault with the page, and once the restore is done copies every page
// left, then ends. So a fork of a session holding 100 MiB runs its first
// command before its memory is back, and its restores on a 2-core host do
// not wait for each other's copies.
//
// The restored processes are in the sandbox's user namespace, where the
// userfaultfd system call is refused (it needs CAP_SYS_PTRACE in the
// host's, or vm.unprivileged_userfaultfd, which would open it to every
// process on the host): patch 0006 of .ci/criu-patches has CRIU's user
// namespace daemon (root on the host) open /dev/userfaultfd (Linux 6.1,
// 0600 root) for each task, which asks it for a userfaultfd of its own
// memory, and the API handshake, which asks for fork and unmap events,
// stays with that daemon as before. The task holds no userfaultfd once
// its restore is done.
//
// A page the daemon never copied would read as zeros: a daemon that fails
// or is killed before it is done kills the fork's processes
// (finishLazy), a dump of the fork waits for that and then refuses
// (waitLazy), and the images stay until it ends (Close waits).

// criuLazyMark is the path patch 0006 has criu open: a criu holding it
// restores a task in a user namespace with lazy pages.
const criuLazyMark = "/dev/userfaultfd"

// lazyPagesWait bounds a lazy-pages daemon's run: the restore and the
// copy of every page after it. A daemon at the bound is killed, and with
// it the fork's processes.
const lazyPagesWait = 10 * time.Minute

// lazyReadyWait bounds the wait for a daemon to listen.
const lazyReadyWait = 10 * time.Second

// criuLazy says whether forks restore with lazy pages: not asked
// otherwise (Config.EagerForks), the criu holds criuLazyMark and the host
// has /dev/userfaultfd.
func (c *checkpoint) criuLazy(path string) bool {
	c.lazyOnce.Do(func() {
		if c.d.cfg.EagerForks {
			return
		}
		if _, err := os.Stat("/dev/userfaultfd"); err != nil {
			return
		}
		c.lazy = c.d.criuMarksOf(path).lazy
	})
	return c.lazy
}

// lazyPages is a criu lazy-pages daemon serving one restore's memory.
type lazyPages struct {
	cancel context.CancelFunc
	ready  chan error // what reading its status pipe gave (a byte: nil)
	done   chan struct{}
	err    error   // once done is closed
	cpu    *phases // the daemon's CPU
	// finished is closed once finishLazy has dealt with the daemon's
	// end: the fork's processes killed if it failed, its marker gone.
	finished chan struct{}
	// held says holdBack lowered the daemon once (under the
	// checkpoint's mu): it is never lowered again, so that it is held
	// back lazyBehindMax at most.
	held bool
}

// errLazyFailed says a fork's lazy-pages daemon ended before it copied
// every page in: its processes were killed.
var errLazyFailed = errors.New("the sandbox's memory could not all be restored (lazy pages): its processes were killed")

// startLazyPages starts a lazy-pages daemon for the restore from imgs
// (its socket, lazy-pages.socket, is there, where the restore finds it);
// listening waits until it listens. The daemon counts in c.lazyRuns
// until finishLazy is through with it, or, for a restore that failed,
// until the caller has stopped it (lp.stop) and called c.lazyRuns.Done.
func (c *checkpoint) startLazyPages(criu, imgs string) (*lazyPages, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	c.lazyRuns.Add(1)
	c.mu.Unlock()
	r, w, err := os.Pipe()
	if err != nil {
		c.lazyRuns.Done()
		return nil, fmt.Errorf("lazy pages: %w", err)
	}
	dctx, cancel := context.WithTimeout(context.Background(), lazyPagesWait)
	lp := &lazyPages{cancel: cancel, ready: make(chan error, 1), done: make(chan struct{}), cpu: newPhases(),
		finished: make(chan struct{})}
	args := []string{"lazy-pages", "-D", imgs, "-o", "lazy-pages.log", "-v2", "--status-fd", "3"}
	go func() {
		defer cancel()
		// As c.run: the thread ends with the goroutine. The gateway's end
		// of the status pipe goes once criu has it (or never will), so
		// that the reader below sees the end of a criu that failed.
		runtime.LockOSThread()
		lp.err = c.d.runCRIU(dctx, criu, args, filepath.Join(imgs, "lazy-pages.log"), []*os.File{w}, lp.cpu, criuHooks{
			started: func(pid int) { w.Close(); c.lazyStarted(lp, pid) },
			exited:  func() { c.lazyExited(lp) },
		})
		w.Close()
		close(lp.done)
	}()
	go func() {
		var b [1]byte
		_, err := r.Read(b[:])
		r.Close()
		lp.ready <- err
	}()
	return lp, nil
}

// lazyNice is the nice value of a lazy-pages daemon that listens while
// other restores of its checkpoint are under way, until none is, or
// lazyBehindMax has passed: a fork ×N's daemons copy their memory in
// behind its other restores rather than beside them. Its own restore's
// end runs behind them too: the daemon starts copying once criu restore
// tells it the processes are made, before criu has let them go and
// ended and the driver has checked them, and a daemon lowered only after
// that had copied a share of its memory at the gateway's priority by
// then (a fork ×4's first commands came 25 ms later for it;
// bench/results/s58-fork-behind.md). A restored task that faults on a
// page the daemon has not copied yet waits, while the daemon is held
// back, on a process at nice 19 beside the other restores; the restore
// itself does so only for a thread caught in a restartable sequence at
// the dump (criu writes its rseq pointer). Patch 0008 of .ci/criu-patches
// has criu restore the init's memory in full, so that nothing the gateway
// waits for next (the restored sandbox's check, its first command) waits
// on a daemon held back so.
const (
	lazyNice      = 19
	lazyBehindMax = time.Second
)

// restoreBegins and restoreDone bracket a Restore of c: the last to end
// gives the daemons held back (c.behind) the gateway's priority again.
func (c *checkpoint) restoreBegins() {
	c.mu.Lock()
	c.restoring++
	c.mu.Unlock()
}

func (c *checkpoint) restoreDone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.restoring--
	if c.restoring == 0 {
		c.letGoLocked()
	}
}

// letGoLocked gives every daemon held back the gateway's priority again.
// Callers hold c.mu.
func (c *checkpoint) letGoLocked() {
	if c.behindTimer != nil {
		c.behindTimer.Stop()
		c.behindTimer = nil
	}
	if len(c.behind) == 0 {
		return
	}
	own, err := niceOf(0)
	for lp := range c.behind {
		if pid, ok := c.daemons[lp]; ok && err == nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, pid, own)
		}
		delete(c.behind, lp)
	}
}

// holdBack lowers the priority of lp's daemon, listening, while other
// restores of c are under way (the caller's counts in c.restoring until
// its restoreDone). A daemon is lowered once at most: one held back
// already, or let go since (lazyBehindMax passed), is left as it is.
func (c *checkpoint) holdBack(lp *lazyPages) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pid, ok := c.daemons[lp]
	if !ok || lp.held || c.restoring < 2 {
		return
	}
	if n, err := niceOf(pid); err != nil || n >= lazyNice || unix.Setpriority(unix.PRIO_PROCESS, pid, lazyNice) != nil {
		return
	}
	lp.held = true
	if c.behind == nil {
		c.behind = map[*lazyPages]struct{}{}
	}
	c.behind[lp] = struct{}{}
	if c.behindTimer == nil {
		c.behindTimer = time.AfterFunc(lazyBehindMax, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.letGoLocked()
		})
	}
}

// lazyStarted records lp's daemon's pid; lazyExited, called before that
// pid is reaped, forgets it: from then on it may name another process.
func (c *checkpoint) lazyStarted(lp *lazyPages, pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.daemons == nil {
		c.daemons = map[*lazyPages]int{}
	}
	c.daemons[lp] = pid
}

func (c *checkpoint) lazyExited(lp *lazyPages) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.daemons, lp)
	delete(c.behind, lp)
}

// niceOf is the nice value of process pid (0: the caller).
func niceOf(pid int) (int, error) {
	p, err := unix.Getpriority(unix.PRIO_PROCESS, pid)
	return 20 - p, err // the system call's 40..1, for nice -20..19
}

// listening waits for the daemon to listen, and stops it if it does not.
func (lp *lazyPages) listening(ctx context.Context) error {
	wait := time.NewTimer(lazyReadyWait)
	defer wait.Stop()
	var err error
	select {
	case err = <-lp.ready:
	case <-lp.done:
		err = errors.New("ended before it listened")
	case <-wait.C:
		err = fmt.Errorf("not listening after %v", lazyReadyWait)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		lp.stop()
		return fmt.Errorf("lazy pages: criu lazy-pages: %w", errors.Join(err, lp.err))
	}
	return nil
}

// stop kills the daemon and waits for it.
func (lp *lazyPages) stop() {
	lp.cancel()
	<-lp.done
}

// finishLazy waits for the daemon serving sandbox st's restore to end,
// then removes the restore's images imgs. A daemon that failed leaves
// pages never copied: the sandbox's processes are killed, never left to
// read zeros, unless its marker is gone already (a Stop killed them, and
// the processes now there, after a resume, are new). Only then are a
// dump of the sandbox (waitLazy) and the checkpoint's Close let go on.
func (c *checkpoint) finishLazy(lp *lazyPages, st *sandboxState, imgs string) {
	defer c.lazyRuns.Done()
	defer close(lp.finished)
	<-lp.done
	dir := c.d.dir(st.ID)
	if lp.err != nil {
		if lazyUnfinished(dir) {
			cgroup.KillProcs(st.Cgroups)
		}
		c.d.log.Error("sandbox_lazy_pages_failed", "sandbox", st.ID, "from", c.src.ID, "err", lp.err,
			"criu_log", logTail(filepath.Join(imgs, "lazy-pages.log"), criuLogTail))
	} else {
		// criu_cpu_ms: the daemon's CPU; ms: its run, the restore's
		// and the copy of the rest.
		c.d.log.Info("sandbox_lazy_pages_done", append([]any{"sandbox", st.ID, "from", c.src.ID}, lp.cpu.attrs()...)...)
	}
	_ = os.RemoveAll(imgs)
	_ = dropLazyMarker(dir)
}

// lazyMarker, in a sandbox's dir, says its memory is being copied in by
// a lazy-pages daemon: a gateway that finds it at Adopt stopped before
// the daemon was done (or could tell), and the sandbox's memory may miss
// pages.
const lazyMarker = "lazy-pages"

// markLazy leaves lazyMarker in sandbox dir dir.
func markLazy(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, lazyMarker), nil, 0o600); err != nil {
		return fmt.Errorf("lazy pages: %w", err)
	}
	return nil
}

// dropLazyMarker removes lazyMarker from sandbox dir dir, if there.
func dropLazyMarker(dir string) error {
	if err := os.Remove(filepath.Join(dir, lazyMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lazy pages: %w", err)
	}
	return nil
}

// lazyUnfinished says whether sandbox dir dir holds lazyMarker.
func lazyUnfinished(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, lazyMarker))
	return err == nil
}

// waitLazy waits, on a fork restored with lazy pages, for its daemon to
// have copied every page in (a dump reads only the pages present: one
// made before would hold zeros for the others). A daemon that failed
// gives errLazyFailed: the pages it never copied read as zeros, and
// must not be dumped.
func (s *linuxSandbox) waitLazy(ctx context.Context) error {
	lp := s.lazy
	if lp == nil {
		return nil
	}
	select {
	case <-lp.finished:
	case <-ctx.Done():
		return fmt.Errorf("checkpoint: the sandbox's memory is still being restored (lazy pages): %w", ctx.Err())
	}
	if lp.err != nil {
		return fmt.Errorf("checkpoint: %w: %w", errLazyFailed, lp.err)
	}
	return nil
}
