//go:build linux

package linuxns_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// The rule both drivers keep (docs/architecture.md, "Ending a command"):
// Process.Kill while the command's first process runs ends its whole tree,
// whatever the tree did to leave its process group; once that process has
// ended on its own, what it left running stays until the session ends.

// TestKillEndsTheWholeTree: a child that ignores SIGHUP, a setsid child and
// a double-forked one all die when the command is killed.
func TestKillEndsTheWholeTree(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			sb := killTestSandbox(t, driver)
			const mark = "4242"
			p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "" +
				"sh -c 'trap \"\" HUP; exec sleep " + mark + "01' & " +
				"setsid sleep " + mark + "02 & " +
				"(setsid sh -c 'trap \"\" HUP; sleep " + mark + "03 & ' &) ; " +
				"sleep 0.2; echo ready; exec sleep " + mark + "04"})
			if err != nil {
				t.Fatal(err)
			}
			waitLine(t, p, "ready")
			if !waitFor(5*time.Second, func() bool { return len(sleepers(mark)) == 4 }) {
				t.Fatalf("before the kill: not all of the command's 4 sleeps run: %v", sleepers(mark))
			}
			p.Kill()
			done := make(chan struct{})
			go func() { _, _ = p.Wait(); close(done) }()
			if !waitFor(sandbox.KillGrace+5*time.Second, func() bool { return len(sleepers(mark)) == 0 }) {
				t.Errorf("%v after the kill: still running %v", sandbox.KillGrace+5*time.Second, sleepers(mark))
			}
			<-done
		})
	}
}

// TestKillLeavesDetachedJobs: a job the command detached before it exited
// on its own survives a later Kill and the end of the command.
func TestKillLeavesDetachedJobs(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			sb := killTestSandbox(t, driver)
			const mark = "4343"
			_, _, exit := runIn(t, sb, "nohup sleep "+mark+"01 >/dev/null 2>&1 & echo started")
			if exit.Code != 0 {
				t.Fatalf("exit %+v", exit)
			}
			p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "nohup setsid sleep " + mark + "02 >/dev/null 2>&1 & echo ready"})
			if err != nil {
				t.Fatal(err)
			}
			waitLine(t, p, "ready")
			if _, err := p.Wait(); err != nil {
				t.Fatal(err)
			}
			p.Kill() // after the command's end: nothing to do
			time.Sleep(sandbox.KillGrace + time.Second)
			if got := sleepers(mark); len(got) != 2 {
				t.Errorf("detached jobs after the commands ended and a late Kill: %v, want both sleeps", got)
			}
		})
	}
}

func killTestSandbox(t *testing.T, driver string) sandbox.Sandbox {
	t.Helper()
	if driver == "linux" {
		requireLinux(t)
	}
	d, err := openDriver(driver, sandbox.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	id := "sbx-kill-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(id) > 64 {
		id = id[:64]
	}
	sb, err := d.Create(context.Background(), sandbox.Spec{ID: strings.ReplaceAll(id, "_", "-")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return sb
}

// waitLine reads p's stdout until a line equal to want.
func waitLine(t *testing.T, p sandbox.Process, want string) {
	t.Helper()
	p.Stdin().Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	sc := bufio.NewScanner(p.Stdout())
	for sc.Scan() {
		if sc.Text() == want {
			go func() { _, _ = io.Copy(io.Discard, p.Stdout()) }()
			return
		}
	}
	t.Fatalf("stdout ended before %q", want)
}

// sleepers lists the host's live `sleep <mark>..` processes.
func sleepers(mark string) []string {
	var out []string
	for _, p := range hostProcesses() {
		if strings.HasPrefix(p.args, "sleep "+mark) && p.state != "Z" {
			out = append(out, fmt.Sprintf("%d:%s", p.pid, p.args))
		}
	}
	return out
}

// TestKillSparesTheNextCommand: the SIGKILL that follows a kill after the
// grace finds the killed command's tree by its namespace; commands started
// meanwhile, once the killed tree is gone, must not be taken for it (a
// freed namespace's inode can name the next one's).
func TestKillSparesTheNextCommand(t *testing.T) {
	sb := killTestSandbox(t, "linux")
	ctx := context.Background()
	var next []sandbox.Process
	for range 5 {
		p, err := sb.Start(ctx, sandbox.Cmd{Command: "exec sleep 100"})
		if err != nil {
			t.Fatal(err)
		}
		p.Stdin().Close()
		p.Kill() // SIGHUP ends sleep at once; the SIGKILL sweep comes after the grace
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		// The init's spawner thread leaves the killed command's namespace
		// for this one's, which frees it for the command after.
		runIn(t, sb, "true")
		q, err := sb.Start(ctx, sandbox.Cmd{Command: fmt.Sprintf("sleep %.1f; echo alive", (sandbox.KillGrace + time.Second).Seconds())})
		if err != nil {
			t.Fatal(err)
		}
		q.Stdin().Close()
		next = append(next, q)
	}
	for i, q := range next {
		out, _ := io.ReadAll(q.Stdout())
		exit, err := q.Wait()
		if err != nil || exit.Signal != "" || strings.TrimSpace(string(out)) != "alive" {
			t.Errorf("command %d started after a kill: %q, %+v, %v", i, out, exit, err)
		}
	}
}
