//go:build linux

package linuxns_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// TestInitReportsEveryExit: commands that end at once, one after another
// and many at a time, each get their own exit status. The init's reaper
// may reap a command before its "started" reply has gone out, or after;
// either way the status reaches the right connection, once.
func TestInitReportsEveryExit(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	for i := range 40 {
		code := i % 7
		if _, _, exit := runIn(t, sb, fmt.Sprintf("exit %d", code)); exit.Code != code || exit.Signal != "" {
			t.Fatalf("exit %d: got %+v", code, exit)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 24)
	for i := range 24 {
		wg.Go(func() {
			code := 100 + i
			p, err := sb.Start(context.Background(), sandbox.Cmd{Command: fmt.Sprintf("exit %d", code)})
			if err != nil {
				errs <- fmt.Sprintf("start %d: %v", code, err)
				return
			}
			p.Stdin().Close()
			exit, err := p.Wait()
			if err != nil || exit.Code != code {
				errs <- fmt.Sprintf("exit %d: got %+v, %v", code, exit, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestInitReapsOrphans: a process whose parent has ended is the init's to
// reap (it is the sandbox's pid 1); none is left a zombie, whether it ends
// while commands run or when none does.
func TestInitReapsOrphans(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	// Each leaves a child that outlives it by a moment, then ends with
	// nobody but the init to wait for it.
	for range 3 {
		if _, _, exit := runIn(t, sb, "(sleep 0.2; exit 3) & (exit 4) & exit 0"); exit.Code != 0 {
			t.Fatalf("command: %+v", exit)
		}
	}
	init := unwrap(sb).(interface{ InitPID() int }).InitPID()
	zombies := func() []string {
		var z []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if err != nil || !strings.Contains(string(st), ") Z ") {
				continue
			}
			// The fourth field is the parent's pid.
			f := strings.Fields(string(st)[strings.LastIndexByte(string(st), ')')+1:])
			if len(f) > 1 && f[1] == itoa(init) {
				z = append(z, e.Name())
			}
		}
		return z
	}
	if !waitFor(5*time.Second, func() bool { return len(zombies()) == 0 }) {
		t.Fatalf("zombies left under the init (pid %d): %v", init, zombies())
	}
	// The sandbox still runs commands afterwards.
	if out, _, exit := runIn(t, sb, "echo ok"); out != "ok\n" || exit.Code != 0 {
		t.Fatalf("after the orphans: %q %+v", out, exit)
	}
}
