//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A restore (a fork's, or a resume from a pause by checkpoint) makes
// processes from images, which say themselves what namespaces, ids and
// filters those processes have: an image tampered with could ask CRIU,
// which runs as root, to restore them in the host's namespaces, as host
// ids, without the seccomp filter. checkConfined checks what CRIU made,
// left stopped (--leave-stopped) so that none of it has run yet, against
// what a fresh sandbox has; continueTree then lets it run.

// checkConfined checks that the processes restored into sandbox st, the
// tree under its init st.Pid, are confined as a fresh sandbox's are: each
// in namespaces (user, pid, mount, network, ipc, uts) not the gateway's,
// in a user namespace that maps the sandbox's uid range and nothing else,
// in the sandbox's cgroups; and each but the init (its commands) with
// no_new_privs, no capability in its bounding set, and, where the sandbox
// has it (st.Seccomp), the seccomp filter. It returns the pids it found,
// for the caller to kill if it fails.
func checkConfined(st *sandboxState) ([]int, error) {
	pids, err := processTree(st.Pid)
	if err != nil {
		return pids, fmt.Errorf("restored processes: %w", err)
	}
	var errs []error
	wantMap := fmt.Sprintf("0 %d %d", st.UIDBase, idRange)
	for _, pid := range pids {
		err := checkProcConfined(st, pid, pid == st.Pid, wantMap)
		if err == nil {
			continue
		}
		// A zombie (restored as one) runs nothing and has no namespaces
		// to read; one that ended meanwhile neither. Not the init.
		if state, _, serr := procStat(pid); pid != st.Pid && (serr != nil || state == 'Z' || state == 'X') {
			continue
		}
		errs = append(errs, fmt.Errorf("restored process %d: %w", pid, err))
	}
	return pids, errors.Join(errs...)
}

// confinedNS are the namespaces a sandbox's processes never share with the
// gateway.
var confinedNS = []string{"user", "pid", "mnt", "net", "ipc", "uts"}

func checkProcConfined(st *sandboxState, pid int, init bool, wantMap string) error {
	proc := "/proc/" + strconv.Itoa(pid)
	for _, ns := range confinedNS {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(proc + "/ns/" + ns)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if mine == its {
			return fmt.Errorf("in the gateway's %s namespace", ns)
		}
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(proc + "/" + f)
		if err != nil {
			return err
		}
		if got := strings.Join(strings.Fields(string(b)), " "); got != wantMap {
			return fmt.Errorf("%s %q, not the sandbox's %q", f, got, wantMap)
		}
	}
	if err := checkCgroups(st, proc); err != nil {
		return err
	}
	if init {
		return nil
	}
	tasks, err := os.ReadDir(proc + "/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(proc + "/task/" + t.Name() + "/status")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // a thread that ended
			}
			return err
		}
		want := map[string]string{"NoNewPrivs": "1", "CapBnd": "0000000000000000"}
		if st.Seccomp {
			want["Seccomp"] = "2"
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if w, check := want[k]; ok && check {
				if v = strings.TrimSpace(v); v != w {
					return fmt.Errorf("thread %s: %s %s, want %s", t.Name(), k, v, w)
				}
				delete(want, k)
			}
		}
		for k := range want {
			return fmt.Errorf("thread %s: no %s in its status", t.Name(), k)
		}
	}
	return nil
}

// checkCgroups checks that the process at proc is, in each cgroup
// hierarchy of the sandbox's (st.Cgroups), in the sandbox's cgroup or
// under it.
func checkCgroups(st *sandboxState, proc string) error {
	b, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		return err
	}
	in := map[string]string{} // controllers -> path
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			in[f[1]] = f[2]
		}
	}
	for _, dir := range st.Cgroups {
		i := strings.Index(dir, "/sandgate/")
		if i < 0 || strings.Contains(dir[i+len("/sandgate/"):], "/") {
			continue // the commands' child: its parent is checked
		}
		want, ctrls := dir[i:], filepath.Base(dir[:i])
		key, found := ctrls, false
		for k := range in {
			if sameControllers(k, ctrls) {
				key, found = k, true
				break
			}
		}
		if !found {
			key = "" // cgroup v2: 0::path
		}
		path, ok := in[key]
		if !ok {
			return fmt.Errorf("in no cgroup of hierarchy %s", ctrls)
		}
		if path != want && !strings.HasPrefix(path, want+"/") {
			return fmt.Errorf("in cgroup %s of hierarchy %s, not the sandbox's %s", path, ctrls, want)
		}
	}
	return nil
}

// sameControllers says whether a and b, comma-separated lists, name the
// same controllers.
func sameControllers(a, b string) bool {
	x, y := strings.Split(a, ","), strings.Split(b, ",")
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// processTree lists pid and its descendants (each thread's children).
func processTree(pid int) ([]int, error) {
	out := []int{pid}
	seen := map[int]bool{pid: true}
	for i := 0; i < len(out); i++ {
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(out[i]) + "/task")
		if err != nil {
			if i > 0 && errors.Is(err, os.ErrNotExist) {
				continue // ended since
			}
			return out, err
		}
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(out[i]) + "/task/" + t.Name() + "/children")
			if err != nil {
				continue
			}
			for f := range strings.FieldsSeq(string(b)) {
				if c, err := strconv.Atoi(f); err == nil && !seen[c] {
					seen[c] = true
					out = append(out, c)
				}
			}
		}
	}
	return out, nil
}

// continueTree lets the restored tree pids (checkConfined's, the init
// first), left stopped by CRIU, run: each task but those stopped at the
// dump (stopped, by pid in the sandbox's pid namespace), the deepest
// first, so that a parent, when it runs, finds its children running (no
// stop of theirs to wait for, only their continue). SIGCONT wakes every
// thread of a task.
func continueTree(pids []int, stopped map[int]bool) error {
	if len(pids) == 0 {
		return nil
	}
	level := len(nsPids(pids[0])) // the init's depth: its pid there is 1
	if level == 0 {
		return fmt.Errorf("restored init %d: no NSpid in its status", pids[0])
	}
	for i := len(pids) - 1; i >= 0; i-- {
		// The init is continued whatever the images say: it is never
		// stopped at a dump (a signal from its own pid namespace cannot
		// stop it), and the gateway dials it next.
		if ns := nsPids(pids[i]); i > 0 && len(ns) >= level && stopped[ns[level-1]] {
			continue
		}
		if err := unix.Kill(pids[i], unix.SIGCONT); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("continue restored process %d: %w", pids[i], err)
		}
	}
	return nil
}

// nsPids is the NSpid line of pid's status: its pid in each pid namespace
// from the gateway's down; nil if it cannot be read (ended).
func nsPids(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		var out []int
		for f := range strings.FieldsSeq(v) {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil
			}
			out = append(out, n)
		}
		return out
	}
	return nil
}

// killTree kills pids (checkConfined's, of a restore refused), and waits,
// at most killTreeWait, for each to end (gone, or a zombie: the init's
// once every process of its pid namespace has ended; the host's init
// reaps it), so that the refusal leaves no process running.
func killTree(pids []int) {
	starts := make([]uint64, len(pids)) // 0: already gone
	for i, pid := range pids {
		_, starts[i], _ = procStat(pid)
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	for deadline := time.Now().Add(killTreeWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if ended(pids, starts) {
			return
		}
	}
}

// killTreeWait bounds killTree's wait for what it killed to end.
const killTreeWait = 5 * time.Second

// ended says whether the processes pids, started at starts and killed,
// have ended: each gone (or another process by now), or a zombie.
func ended(pids []int, starts []uint64) bool {
	for i, pid := range pids {
		state, start, err := procStat(pid)
		if err == nil && starts[i] != 0 && start == starts[i] && state != 'Z' && state != 'X' {
			return false
		}
	}
	return true
}
