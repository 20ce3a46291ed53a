//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoFreezer is Freeze's answer for cgroups with no freezer: a v1 host
// without the freezer hierarchy, or a sandbox made before it was used.
var ErrNoFreezer = errors.New("the sandbox's cgroups have no freezer")

// ErrFreezeTimeout is Freeze's answer when the kernel has not frozen every
// process within FreezeTimeout (a task stuck in an uninterruptible wait,
// say); the cgroups are thawed again before it returns.
var ErrFreezeTimeout = errors.New("the sandbox's processes did not freeze in time")

// FreezeTimeout bounds how long Freeze waits for the kernel to freeze
// every process, whatever the caller's context allows.
const FreezeTimeout = 5 * time.Second

// Freeze freezes every process in the sandbox whose cgroups are dirs (as
// Set.All lists them) and returns once they all are, with the thaw that
// lets them run again. On v1 it freezes the init's cgroup in the freezer
// hierarchy (its procs child with it); on v2 it writes cgroup.freeze.
// It waits at most FreezeTimeout (ErrFreezeTimeout) or until ctx ends;
// either way it thaws before it returns an error.
func Freeze(ctx context.Context, dirs []string) (thaw func() error, err error) {
	for _, dir := range dirs {
		if filepath.Base(dir) == "procs" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "freezer.state")); err == nil {
			return freeze(ctx, filepath.Join(dir, "freezer.state"), "FROZEN", "THAWED", FreezeTimeout,
				func() (bool, error) { return stateIs(filepath.Join(dir, "freezer.state"), "FROZEN") })
		}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err == nil && isCgroup2(dir) {
			return freeze(ctx, filepath.Join(dir, "cgroup.freeze"), "1", "0", FreezeTimeout,
				func() (bool, error) { return eventsFrozen(filepath.Join(dir, "cgroup.events")) })
		}
	}
	return nil, ErrNoFreezer
}

// Re-freezing while a freeze is not done: the v1 freezer leaves a
// cgroup FREEZING for good when a task forked while it froze escaped it
// (a shell loop starting a process every few milliseconds hits this
// about one freeze in twenty), and only a new write of FROZEN freezes
// the newcomers. So every poll writes on again, and a freeze still not
// done after thawEvery is undone for thawPause and tried afresh, which
// lets a task stuck half-way (in a vfork, say) get out of the way; the
// wait before the next such retry doubles, so that a freeze that is only
// slow (a loaded host) is not undone again and again.
const (
	thawEvery = 100 * time.Millisecond
	thawPause = 5 * time.Millisecond
)

// freeze writes on to file, then waits until frozen says the kernel is
// done, for at most timeout, writing on again while it waits; off undoes
// it.
func freeze(ctx context.Context, file, on, off string, timeout time.Duration, frozen func() (bool, error)) (func() error, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrFreezeTimeout)
	defer cancel()
	thaw := func() error {
		// A cgroup that is gone (the sandbox was stopped) froze nothing.
		if err := os.WriteFile(file, []byte(off), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("thaw: %w", err)
		}
		return nil
	}
	if err := os.WriteFile(file, []byte(on), 0); err != nil {
		return nil, fmt.Errorf("freeze: %w", err)
	}
	since, every := time.Now(), thawEvery
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		ok, err := frozen()
		if err == nil && ok {
			return thaw, nil
		}
		if err == nil && ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("freeze: %w", err), thaw())
		}
		select {
		case <-ctx.Done():
			continue // the check above says so
		case <-time.After(delay):
		}
		if time.Since(since) >= every {
			if err := thaw(); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
			case <-time.After(thawPause):
			}
			since, every, delay = time.Now(), 2*every, 50*time.Microsecond
		}
		if err := os.WriteFile(file, []byte(on), 0); err != nil {
			return nil, errors.Join(fmt.Errorf("freeze: %w", err), thaw())
		}
	}
}

// Thaw lets every process in dirs (a sandbox's cgroups, as Set.All lists
// them) run again, whatever froze them: a snapshot's Freeze cut short by
// a crash of the gateway, or a thaw that failed. It reports whether any
// of them was frozen. A dir that is gone, or has no freezer, is skipped.
func Thaw(dirs []string) (wasFrozen bool, err error) {
	var errs []error
	for _, dir := range dirs {
		for _, f := range []struct{ file, on, off string }{
			{"freezer.state", "FROZEN", "THAWED"},
			{"cgroup.freeze", "1", "0"},
		} {
			path := filepath.Join(dir, f.file)
			b, rerr := os.ReadFile(path)
			if rerr != nil {
				continue // no such freezer here, or no such cgroup
			}
			// v1 says FREEZING while half done; v2's cgroup.freeze is what
			// was asked, which is what a thaw undoes.
			if state := strings.TrimSpace(string(b)); state == f.off || f.file == "cgroup.freeze" && !isCgroup2(dir) {
				continue
			}
			wasFrozen = true
			if werr := os.WriteFile(path, []byte(f.off), 0); werr != nil && !errors.Is(werr, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("thaw %s: %w", dir, werr))
			}
		}
	}
	return wasFrozen, errors.Join(errs...)
}

func stateIs(file, want string) (bool, error) {
	b, err := os.ReadFile(file)
	return strings.TrimSpace(string(b)) == want, err
}

func eventsFrozen(file string) (bool, error) {
	b, err := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		if line == "frozen 1" {
			return true, err
		}
	}
	return false, err
}
