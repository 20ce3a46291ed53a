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

// Freeze freezes every process in the sandbox whose cgroups are dirs (as
// Set.All lists them) and returns once they all are, with the thaw that
// lets them run again. On v1 it freezes the init's cgroup in the freezer
// hierarchy (its procs child with it); on v2 it writes cgroup.freeze.
func Freeze(ctx context.Context, dirs []string) (thaw func() error, err error) {
	for _, dir := range dirs {
		if filepath.Base(dir) == "procs" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "freezer.state")); err == nil {
			return freeze(ctx, filepath.Join(dir, "freezer.state"), "FROZEN", "THAWED",
				func() (bool, error) { return stateIs(filepath.Join(dir, "freezer.state"), "FROZEN") })
		}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err == nil && isCgroup2(dir) {
			return freeze(ctx, filepath.Join(dir, "cgroup.freeze"), "1", "0",
				func() (bool, error) { return eventsFrozen(filepath.Join(dir, "cgroup.events")) })
		}
	}
	return nil, ErrNoFreezer
}

func freeze(ctx context.Context, file, on, off string, frozen func() (bool, error)) (func() error, error) {
	thaw := func() error {
		if err := os.WriteFile(file, []byte(off), 0); err != nil {
			return fmt.Errorf("thaw: %w", err)
		}
		return nil
	}
	if err := os.WriteFile(file, []byte(on), 0); err != nil {
		return nil, fmt.Errorf("freeze: %w", err)
	}
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		ok, err := frozen()
		if err == nil && ok {
			return thaw, nil
		}
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("freeze: %w", err), thaw())
		}
		time.Sleep(delay)
	}
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
