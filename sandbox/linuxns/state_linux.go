//go:build linux

package linuxns

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// sandboxState is what the gateway keeps on disk about a sandbox, in
// <DataDir>/sandboxes/<id>/state.json: enough to find its init again after
// a gateway restart (to re-adopt or reap it) and to remove everything it
// owns on the host.
type sandboxState struct {
	ID string `json:"id"`
	// Slot numbers the host uid/gid range: UIDBase = hostIDBase + Slot*idRange.
	Slot    int `json:"slot"`
	UIDBase int `json:"uidBase"`
	// Pid and StartTime (clock ticks after boot, /proc/<pid>/stat field 22)
	// identify the init; a pid alone may have been reused.
	Pid       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"startTime,omitempty"`
	// Cgroups lists the sandbox's cgroup directories, children first.
	Cgroups   []string  `json:"cgroups,omitempty"`
	Workspace string    `json:"workspace"`
	Image     string    `json:"image,omitempty"`
	Socket    string    `json:"socket"`
	Created   time.Time `json:"created"`
	// Protocol is the version of the control protocol the init speaks: an
	// upgraded gateway may adopt an init started by an older binary.
	Protocol int `json:"protocol"`
	// Seccomp says the init runs its commands under the seccomp filter;
	// false for inits started without it (a test switch) or by a binary
	// older than the filter.
	Seccomp bool `json:"seccomp,omitempty"`
	// KeepJobs says the init keeps commands started with a key
	// (sandbox.Cmd.Keep) across gateway restarts; false for an init
	// started by an older binary.
	KeepJobs bool `json:"keepJobs,omitempty"`
	// KeepPTY says the init keeps commands on a terminal too (it holds a
	// copy of the terminal's master); false for an older binary's.
	KeepPTY bool `json:"keepPTY,omitempty"`
	// KeepLater says the init keeps a command started without a key
	// when asked to as it runs ("keep": sandbox.KeepLater); false for an
	// older binary's, which ignores the request: KeepAs then refuses at
	// once rather than wait for an answer that never comes.
	KeepLater bool `json:"keepLater,omitempty"`
	// Stopped says the sandbox was stopped (Stopper): it has no init and
	// no cgroups, only its files; Pid is 0 once the init is gone.
	Stopped bool `json:"stopped,omitempty"`
	// Paused says the sandbox is paused (Pauser): its cgroups are frozen
	// and stay so until Unpause, across gateway restarts too.
	Paused bool `json:"paused,omitempty"`
	// PauseImages, on a paused sandbox, is the dir of the CRIU images of
	// a pause by checkpoint (pause_checkpoint_linux.go): its processes
	// are gone, and Unpause restores them from there. "" for a freeze.
	PauseImages string `json:"pauseImages,omitempty"`
	// PauseMounts, on a paused sandbox, is its mount table at the dump
	// (restore_mounts_linux.go), kept out of the images dir: a resume's
	// must match it.
	PauseMounts []mountRec `json:"pauseMounts,omitempty"`
	// Restored says the init was restored by CRIU (a fork's, or one
	// resumed from a pause by checkpoint): CRIU cannot dump it again
	// (checkpointable), until a stop and resume boot a new one.
	Restored bool `json:"restored,omitempty"`
	// Checkpoint says the init was built to be checkpointed
	// (sandbox.Config.Checkpoint).
	Checkpoint bool `json:"checkpoint,omitempty"`
	// EtcTemplate says that the sandbox's /etc is a clone of the
	// gateway's template (etcTemplate), whose files are every sandbox's:
	// a claim's times go to the files bound over it alone.
	EtcTemplate bool `json:"etcTemplate,omitempty"`
	// EtcDir, for a checkpointable default root, names the gateway's
	// /etc dir bound at its /etc (etcDirs.path), which a restore binds
	// again; "" when its init built its /etc (a tmpfs of its own).
	EtcDir string `json:"etcDir,omitempty"`
	// Boot is what a new init of the sandbox needs (Resume); nil for a
	// sandbox made by a gateway without stop.
	Boot *bootSpec `json:"boot,omitempty"`
}

// bootSpec is what Create was asked for that each init of the sandbox
// needs again.
type bootSpec struct {
	// Image is the image the root is built from (its layers are held by
	// the gateway's image store for as long as the session lives).
	Image *sandbox.Image `json:"image,omitempty"`
	// Limits are the sandbox's limits in force (the driver's defaults
	// filled in).
	Limits   sandbox.Limits `json:"limits"`
	TrustPEM []byte         `json:"trustPEM,omitempty"`
}

const stateFile = "state.json"

func (st *sandboxState) save(dir string) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save sandbox state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("save sandbox state: %w", err)
	}
	return nil
}

func loadState(dir string) (*sandboxState, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var st sandboxState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("sandbox state %s: %w", dir, err)
	}
	if st.ID != filepath.Base(dir) {
		return nil, fmt.Errorf("sandbox state %s names %q", dir, st.ID)
	}
	return &st, nil
}

// procStat returns the state letter and start time of pid.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, errors.New("malformed stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, err
	}
	return f[0][0], start, nil
}

// errInitGone says a sandbox's init is no longer running.
var errInitGone = errors.New("sandbox init is not running")

// openInit returns a pidfd for st's init if that very process still runs.
func openInit(st *sandboxState, flags int) (int, error) {
	if st.Pid <= 0 {
		return -1, errInitGone
	}
	fd, err := unix.PidfdOpen(st.Pid, flags)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, errInitGone
		}
		return -1, fmt.Errorf("pidfd_open: %w", err)
	}
	// The pidfd pins the process: if it is the one started, it stays so.
	state, start, err := procStat(st.Pid)
	if err != nil || start != st.StartTime || state == 'Z' || state == 'X' {
		unix.Close(fd)
		return -1, errInitGone
	}
	return fd, nil
}

// killPidfd sends SIGKILL through pidfd and waits up to timeout for the
// process to be gone. A dead pid namespace init takes every process of its
// namespace with it before it counts as exited.
func killPidfd(fd int, timeout time.Duration) error {
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill init: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return errors.New("init did not exit after SIGKILL")
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(min(left, time.Second)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for init: %w", err)
		}
		if n > 0 {
			return nil
		}
	}
}
