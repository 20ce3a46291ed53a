//go:build linux

package linuxns

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/mountinfo"
)

// CRIU, which runs as root, makes a restored sandbox's mounts from the
// images (mountpoints-*.img): an image tampered with could ask it for a
// mount the sandbox did not have (a bind of a host dir, a host disk) or
// one less restricted. The driver records the sandbox's mount table when
// it dumps it (readMounts; a fork's checkpoint keeps it in memory, a
// pause in the sandbox's state file, out of the images dir), and
// checkMounts compares what CRIU made with it before the gateway uses the
// restored processes.

// mountRec is what a mount exposes: where, what filesystem, which of it
// (its root within it, its source), and how (the restricting flags).
// Mount ids and device numbers are not kept: a restore makes new ones.
type mountRec struct {
	Point  string `json:"point"`
	FSType string `json:"fstype"`
	Root   string `json:"root"`
	Source string `json:"source"`
	// Flags are those of ro, nosuid, nodev, noexec the mount has (ro
	// also when its superblock is read-only), in that order.
	Flags string `json:"flags,omitempty"`
	// Propagation is how the mount shares mounts with others: "" (a
	// private one), or those of shared, master, unbindable it is (the
	// peer group numbers left out). A slave of a host mount would
	// receive what the host mounts there.
	Propagation string `json:"propagation,omitempty"`
	// dev is the mount's device (major:minor), for the workspace's check.
	dev string
}

// restrictFlags are the mount flags a restored mount may not lose.
var restrictFlags = []string{"ro", "nosuid", "nodev", "noexec"}

// parseMountLine parses a line of /proc/<pid>/mountinfo.
func parseMountLine(line string) (mountRec, error) {
	e, ok := mountinfo.Parse(line)
	if !ok {
		return mountRec{}, fmt.Errorf("mountinfo line %q", line)
	}
	opts := strings.Split(e.MountOpts, ",")
	super := strings.Split(e.SuperOpts, ",")
	var flags []string
	for _, f := range restrictFlags {
		if slices.Contains(opts, f) || (f == "ro" && slices.Contains(super, "ro")) {
			flags = append(flags, f)
		}
	}
	var prop []string
	for _, f := range e.Optional {
		kind, _, _ := strings.Cut(f, ":")
		if !slices.Contains(prop, kind) {
			prop = append(prop, kind)
		}
	}
	slices.Sort(prop)
	return mountRec{Point: e.Point, FSType: e.FSType, Root: e.Root, Source: mountinfo.Unescape(e.Source),
		Flags: strings.Join(flags, ","), Propagation: strings.Join(prop, ","), dev: e.Dev}, nil
}

// readMounts reads the mount table of process pid's mount namespace, as
// seen from its root.
func readMounts(pid int) ([]mountRec, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("mounts: %w", err)
	}
	var out []mountRec
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		m, err := parseMountLine(line)
		if err != nil {
			return nil, fmt.Errorf("mounts of %d: %w", pid, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// checkMounts checks the mounts CRIU made for the restored processes pids
// (checkConfined's) of sandbox st against want, the sandbox's at the
// dump: every process (but a zombie's, which has none) in its init's
// mount namespace, and that namespace with the same mounts, none added,
// none missing, none with another filesystem, root, source or
// propagation, none that lost ro, nosuid, nodev or noexec. The workspace, which a restore
// mounts anew (a fork's own copy, on its own loop device), must be the
// filesystem mounted at st.Workspace on the host instead of the dump's
// source.
func checkMounts(st *sandboxState, pids []int, want []mountRec) error {
	if len(want) == 0 {
		return errors.New("no record of the sandbox's mounts at the dump (paused by an older gateway?)")
	}
	initNS, err := os.Readlink("/proc/" + strconv.Itoa(st.Pid) + "/ns/mnt")
	if err != nil {
		return fmt.Errorf("restored init: %w", err)
	}
	for _, pid := range pids[1:] {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
		if err != nil {
			continue // a zombie, or ended since: no mounts
		}
		if ns != initNS {
			return fmt.Errorf("restored process %d: in a mount namespace not its init's", pid)
		}
	}
	got, err := readMounts(st.Pid)
	if err != nil {
		return err
	}
	// The device of the filesystem the driver mounted at st.Workspace
	// (its loop device's), as mountinfo writes it.
	var ws unix.Stat_t
	if err := unix.Stat(st.Workspace, &ws); err != nil {
		return fmt.Errorf("the workspace: %w", err)
	}
	return compareMounts(got, want, fmt.Sprintf("%d:%d", unix.Major(ws.Dev), unix.Minor(ws.Dev)))
}

// compareMounts compares the restored mount table got with want (see
// checkMounts); wsDev is the device of the restored sandbox's workspace.
func compareMounts(got, want []mountRec, wsDev string) error {
	left := slices.Clone(want)
	var errs []error
	for _, g := range got {
		i := slices.IndexFunc(left, func(w mountRec) bool { return w.Point == g.Point && sameMount(g, w, wsDev) })
		if i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		j := slices.IndexFunc(left, func(w mountRec) bool { return w.Point == g.Point })
		if j < 0 {
			errs = append(errs, fmt.Errorf("a mount at %s (%s %s, root %s) the sandbox did not have", g.Point, g.FSType, g.Source, g.Root))
			continue
		}
		w := left[j]
		left = slices.Delete(left, j, j+1)
		errs = append(errs, fmt.Errorf("the mount at %s is %s %s root %s (%s; %s), not the sandbox's %s %s root %s (%s; %s)",
			g.Point, g.FSType, g.Source, g.Root, g.Flags, g.Propagation, w.FSType, w.Source, w.Root, w.Flags, w.Propagation))
	}
	for _, w := range left {
		errs = append(errs, fmt.Errorf("the sandbox's mount at %s (%s) is missing", w.Point, w.FSType))
	}
	return errors.Join(errs...)
}

// sameMount says whether restored mount g exposes what w did, as
// restricted.
func sameMount(g, w mountRec, wsDev string) bool {
	if g.FSType != w.FSType || g.Root != w.Root || g.Propagation != w.Propagation {
		return false
	}
	if g.Point == "/workspace" {
		if wsDev == "" || g.dev != wsDev {
			return false
		}
	} else if g.Source != w.Source {
		return false
	}
	for f := range strings.SplitSeq(w.Flags, ",") {
		if f != "" && !slices.Contains(strings.Split(g.Flags, ","), f) {
			return false
		}
	}
	return true
}
