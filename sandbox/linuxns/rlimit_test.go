//go:build linux

package linuxns_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// openFilesScript raises the soft limit as far as it may go, then opens
// descriptors until the kernel refuses, and prints how many it got.
const openFilesScript = `ulimit -Sn "$(ulimit -Hn)"; n=0; while exec {fd}</dev/null; do n=$((n+1)); [ $n -ge 100000 ] && break; done 2>/dev/null; echo $n`

// A sandbox's processes get their own RLIMIT_NOFILE, never the gateway's
// raised one: one session could otherwise open hundreds of thousands of
// files and exhaust the host's file table.
func TestLinuxNofileLimit(t *testing.T) {
	for _, tt := range []struct {
		name       string
		cfg        sandbox.Nofile
		pids       int64
		soft, hard int
	}{
		{"default", sandbox.Nofile{}, 0, sandbox.DefaultNofileSoft, sandbox.DefaultNofileHard},
		{"configured", sandbox.Nofile{Soft: 200, Hard: 300}, 16, 200, 300},
		// The init holds two descriptors per running command and three
		// more per kept one (2 x pids + 3 x min(pids, 96) + 64): a
		// session with more pids than the soft limit covers gets a soft
		// limit raised to that, and a hard one with it if needed.
		{"configured, raised", sandbox.Nofile{Soft: 100, Hard: 300}, 16, 144, 300},
		{"many pids", sandbox.Nofile{}, 1024, 2400, sandbox.DefaultNofileHard},
		{"many pids, low hard limit", sandbox.Nofile{Soft: 100, Hard: 300}, 1024, 2400, 2400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := openLinux(t, sandbox.Config{DataDir: t.TempDir(), Nofile: tt.cfg})
			sb, err := d.Create(context.Background(), sandbox.Spec{ID: "sbx-nofile", Limits: sandbox.Limits{Pids: tt.pids}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
			want := strconv.Itoa(tt.soft) + " " + strconv.Itoa(tt.hard) + "\n"
			if out, stderr, _ := runIn(t, sb, `echo "$(ulimit -Sn) $(ulimit -Hn)"`); out != want {
				t.Fatalf("ulimit -Sn/-Hn: %q (stderr %q), want %q", out, stderr, want)
			}
			if _, _, e := runIn(t, sb, "ulimit -Hn "+strconv.Itoa(tt.hard+1)+" 2>/dev/null"); e.Code == 0 {
				t.Errorf("raised the hard limit past %d", tt.hard)
			}
			out, stderr, _ := runIn(t, sb, openFilesScript)
			n, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				t.Fatalf("open files: %q %q", out, stderr)
			}
			t.Logf("one process opened %d descriptors (hard limit %d)", n, tt.hard)
			// bash's own descriptors (stdio, its script) come off the limit.
			if n >= tt.hard || n < tt.hard-16 {
				t.Errorf("opened %d descriptors, want just under the hard limit %d", n, tt.hard)
			}
			if tt.pids < 1000 {
				return
			}
			// 600 commands at once: more than a 1024-descriptor init could
			// hold the connections of.
			var ps []sandbox.Process
			defer func() {
				for _, p := range ps {
					_ = p.Signal(syscall.SIGKILL)
					_, _ = p.Wait()
				}
			}()
			for i := range 600 {
				p, err := sb.Start(context.Background(), sandbox.Cmd{Command: "exec sleep 100"})
				if err != nil {
					t.Fatalf("command %d of 600: %v", i, err)
				}
				p.Stdin().Close()
				ps = append(ps, p)
			}
		})
	}
}

// Each sandbox has a machine-id of its own, never the host's.
func TestLinuxMachineID(t *testing.T) {
	d := openLinux(t, sandbox.Config{DataDir: t.TempDir()})
	host, _ := os.ReadFile("/etc/machine-id")
	seen := map[string]bool{}
	for _, id := range []string{"sbx-mid-a", "sbx-mid-b"} {
		sb, err := d.Create(context.Background(), sandbox.Spec{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		out, stderr, _ := runIn(t, sb, "cat /etc/machine-id")
		if !regexp.MustCompile(`^[0-9a-f]{32}\n$`).MatchString(out) {
			t.Fatalf("/etc/machine-id is %q (stderr %q), want 32 hex digits", out, stderr)
		}
		if len(host) > 0 && out == string(host) {
			t.Errorf("%s has the host's machine-id", id)
		}
		if seen[out] {
			t.Errorf("%s shares its machine-id with another sandbox", id)
		}
		seen[out] = true
	}
}
