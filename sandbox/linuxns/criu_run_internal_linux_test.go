//go:build linux

package linuxns

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A criu ended at its deadline while what it forked still holds its
// output (its helpers and half-restored tasks, after a restore that hung
// under load) no longer keeps the run, and so the resume and the
// sandbox's lock, waiting for them: its whole process group goes.
func TestRunCRIUEndsWhatItForked(t *testing.T) {
	requireRoot(t, "runCRIU makes a mount namespace of its own")
	dir := t.TempDir()
	fake := filepath.Join(dir, "criu")
	helperPid := filepath.Join(dir, "helper.pid")
	script := "#!/bin/sh\nsleep 600 &\necho $! > " + helperPid + "\nexec sleep 600\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{root: dir, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- (&checkpoint{d: d}).run(ctx, fake, []string{"restore"}, filepath.Join(dir, "restore.log"), nil, nil)
	}()
	helper := func() int {
		b, _ := os.ReadFile(helperPid)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("a criu ended at its deadline: no error")
		}
	case <-time.After(60 * time.Second): // a hang, not a timing
		if pid := helper(); pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		<-done
		t.Fatal("the run waited for what criu forked after criu ended")
	}
	pid := helper()
	if pid <= 0 {
		t.Fatal("the fake criu wrote no helper pid")
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			break
		}
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(b), ") Z ") {
			break // ended, not yet reaped by its new parent
		}
		if time.Now().After(deadline) {
			_ = unix.Kill(pid, unix.SIGKILL)
			t.Fatal("criu's helper outlived it")
		}
	}
}
