//go:build linux

// Package cgroup makes and removes the cgroups that limit each sandbox, on
// cgroup v1 or v2, whichever this host offers per controller. It runs in
// the gateway, for the linuxns driver.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/mountinfo"
	"github.com/sandgate/sandgate/internal/procio"
)

// Headroom the init gets above the commands' limits (cgroup v1, where the
// init sits in the sandbox's cgroup and the commands in its child "procs").
const (
	initReserveMemory = 64 << 20
	initReservePids   = 64
	cpuPeriodMicros   = 100000
	// The CPU weight of an init while it builds its sandbox, and after
	// (the kernel's defaults), for cgroup v1 and v2: see Started.
	startSharesV1, runSharesV1 = 64 * 1024, 1024
	startWeightV2, runWeightV2 = 6400, 100
	// The CPU weight of a warm sandbox (gateway's warm pool) while it is
	// built and while it waits to be claimed: a sixteenth of a running
	// sandbox's, so that a refill yields the CPU to the creates that
	// claim and run (Idle), but still gets some beside busy sandboxes.
	// The kernel's least (2) starved it: beside 20 busy sandboxes a
	// build took 2.8-17 s, near the init's 30 s bound.
	idleSharesV1, idleWeightV2 = 64, 6
)

// cgroupControllers are the controllers the linux driver limits with;
// cpuacct, which limits nothing: on cgroup v1 it alone counts CPU time
// (for the session's stats, stats_linux.go; v2 counts it in every cgroup);
// and the freezer (v1; v2's cgroup.freeze needs no controller), which
// snapshots use (Freeze).
var cgroupControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// Plan is how this host limits sandboxes, found once at Open.
//
// cgroup v1 (one hierarchy per controller, or a few co-mounted):
// <mount>/sandgate/<id> holds the init, with the limits plus a little
// headroom; <mount>/sandgate/<id>/procs holds the commands with the limits.
// The init is born in the first (the gateway forks it from a thread that
// joined it); the init's spawner thread joins procs, so only the commands
// fork into it. Only threads that move themselves do: moving a whole
// process takes a global lock and an RCU grace period (milliseconds).
//
// cgroup v2 (where the controllers are enabled): one cgroup
// <mount>/sandgate/<id> holds the init and the commands, with the limits.
type Plan struct {
	v1      []cgroupHier
	v2      string   // unified mount, when some controllers come from it
	v2Ctls  []string // controllers used from v2
	via     map[string]string
	missing map[string]string
}

type cgroupHier struct {
	mount string
	ctls  []string // of cgroupControllers, in this hierarchy
}

// Detect finds, for each controller, a hierarchy where the gateway
// can create cgroups.
func Detect() *Plan {
	p := &Plan{via: map[string]string{}, missing: map[string]string{}}
	v1, v2, err := cgroupMounts()
	if err != nil {
		for _, c := range cgroupControllers {
			p.missing[c] = err.Error()
		}
		return p
	}
	for _, c := range cgroupControllers {
		if mnt, ok := v1[c]; ok {
			// Its "sandgate" parent is made with the first sandbox.
			if err := unix.Access(mnt, unix.W_OK); err != nil {
				p.missing[c] = fmt.Sprintf("cgroup v1 %s hierarchy at %s is not writable: %v", c, mnt, err)
				continue
			}
			i := slices.IndexFunc(p.v1, func(h cgroupHier) bool { return h.mount == mnt })
			if i < 0 {
				p.v1 = append(p.v1, cgroupHier{mount: mnt})
				i = len(p.v1) - 1
			}
			p.v1[i].ctls = append(p.v1[i].ctls, c)
			p.via[c] = "cgroup v1"
			continue
		}
		if v2 == "" {
			p.missing[c] = "no cgroup v1 hierarchy and no cgroup v2 mount has the " + c + " controller"
			continue
		}
		if c == "freezer" { // cgroup.freeze is in every v2 cgroup
			p.v2 = v2
			p.via[c] = "cgroup v2"
			continue
		}
		if err := enableV2(v2, c); err != nil {
			p.missing[c] = err.Error()
			continue
		}
		p.v2 = v2
		p.v2Ctls = append(p.v2Ctls, c)
		p.via[c] = "cgroup v2"
	}
	return p
}

// cgroupMounts reads the v1 hierarchies (controller -> mount point) and the
// v2 mount from the calling thread's mountinfo (/proc/self is the main
// thread's, which may be parked in another mount namespace).
func cgroupMounts() (v1 map[string]string, v2 string, err error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	v1 = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := mountinfo.Parse(sc.Text())
		if !ok {
			continue
		}
		switch m.FSType {
		case "cgroup":
			for _, opt := range strings.Split(m.SuperOpts, ",") {
				if slices.Contains(cgroupControllers, opt) {
					v1[opt] = m.Point
				}
			}
		case "cgroup2":
			if v2 == "" || m.Point == "/sys/fs/cgroup" {
				v2 = m.Point
			}
		}
	}
	return v1, v2, sc.Err()
}

// enableV2 makes controller c available to children of <v2>/sandgate.
func enableV2(v2, c string) error {
	avail, err := os.ReadFile(filepath.Join(v2, "cgroup.controllers"))
	if err != nil || !slices.Contains(strings.Fields(string(avail)), c) {
		return fmt.Errorf("cgroup v2 at %s does not offer the %s controller", v2, c)
	}
	parent := filepath.Join(v2, "sandgate")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("cgroup v2 at %s is not writable: %w", v2, err)
	}
	for _, dir := range []string{v2, parent} {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			return fmt.Errorf("enable cgroup v2 %s controller in %s: %w", c, dir, err)
		}
	}
	return nil
}

// Set are one sandbox's cgroups.
type Set struct {
	// inits are the v1 cgroups the init joins (one per hierarchy); procs
	// are the v1 cgroups of the commands, in the same order.
	inits, procs []string
	// cpuInit is, of inits, the one in the v1 hierarchy of the cpu
	// controller: the init joins it only once its root is built (CPUTasks).
	cpuInit string
	// v2 is the cgroup v2 of the init and its commands.
	v2 string
}

// All lists every cgroup directory, children first (removal order).
func (c *Set) All() []string {
	all := append(slices.Clone(c.procs), c.inits...)
	if c.v2 != "" {
		all = append(all, c.v2)
	}
	return all
}

// Create makes the cgroups of sandbox id with limits l.
func (p *Plan) Create(id string, l Limits) (*Set, error) {
	sc := &Set{}
	for _, h := range p.v1 {
		dir := filepath.Join(h.mount, "sandgate", id)
		procs := filepath.Join(dir, "procs")
		if err := mkdirCgroup(dir); err != nil {
			return sc, err
		}
		if err := os.Mkdir(procs, 0o755); err != nil {
			return sc, fmt.Errorf("create cgroup: %w", err)
		}
		sc.inits = append(sc.inits, dir)
		sc.procs = append(sc.procs, procs)
		if slices.Contains(h.ctls, "cpu") {
			sc.cpuInit = dir
		}
		for _, c := range h.ctls {
			if err := limitV1(c, dir, procs, l); err != nil {
				return sc, err
			}
			if c == "cpu" {
				if err := (setting{dir, "cpu.shares", strconv.Itoa(startSharesV1)}).write(); err != nil {
					return sc, err
				}
			}
		}
	}
	if p.v2 != "" {
		dir := filepath.Join(p.v2, "sandgate", id)
		if err := mkdirCgroup(dir); err != nil {
			return sc, err
		}
		sc.v2 = dir
		for _, c := range p.v2Ctls {
			if err := limitV2(c, dir, l); err != nil {
				return sc, err
			}
			if c == "cpu" {
				if err := (setting{dir, "cpu.weight", strconv.Itoa(startWeightV2)}).write(); err != nil {
					return sc, err
				}
			}
		}
	}
	return sc, nil
}

// mkdirCgroup creates dir, and its parent "sandgate" again if a concurrent
// Destroy just removed it.
func mkdirCgroup(dir string) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(dir), 0o755); err == nil {
			err = os.Mkdir(dir, 0o755)
		}
	}
	if err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	return nil
}

// setting is one value to write to one cgroup file.
type setting struct{ dir, file, value string }

func (x setting) write() error {
	if err := os.WriteFile(filepath.Join(x.dir, x.file), []byte(x.value), 0); err != nil {
		return fmt.Errorf("set %s: %w", x.file, err)
	}
	return nil
}

func limitV1(c, dir, procs string, l Limits) error {
	for _, x := range settingsV1(c, dir, procs, l) {
		if err := x.write(); err != nil {
			return err
		}
	}
	return nil
}

func settingsV1(c, dir, procs string, l Limits) []setting {
	var s []setting
	switch c {
	case "memory":
		outer, inner := strconv.FormatInt(l.MemoryBytes+initReserveMemory, 10), strconv.FormatInt(l.MemoryBytes, 10)
		s = []setting{{dir, "memory.limit_in_bytes", outer}, {procs, "memory.limit_in_bytes", inner}}
		// memsw (memory + swap) exists with swap accounting: swap counts
		// against the same limit.
		if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
			s = append(s, setting{dir, "memory.memsw.limit_in_bytes", outer}, setting{procs, "memory.memsw.limit_in_bytes", inner})
		}
	case "pids":
		s = []setting{
			{dir, "pids.max", strconv.FormatInt(l.Pids+initReservePids, 10)},
			{procs, "pids.max", strconv.FormatInt(l.Pids, 10)},
		}
	case "cpu":
		s = []setting{
			{procs, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodMicros)},
			{procs, "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(l.CPUs), 10)},
		}
	}
	return s
}

func limitV2(c, dir string, l Limits) error {
	for _, x := range settingsV2(c, dir, l) {
		if err := x.write(); err != nil {
			return err
		}
	}
	return nil
}

func settingsV2(c, dir string, l Limits) []setting {
	var s []setting
	switch c {
	case "memory":
		s = append(s, setting{dir, "memory.max", strconv.FormatInt(l.MemoryBytes, 10)})
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			s = append(s, setting{dir, "memory.swap.max", "0"})
		}
	case "pids":
		s = append(s, setting{dir, "pids.max", strconv.FormatInt(l.Pids, 10)})
	case "cpu":
		s = append(s, setting{dir, "cpu.max", fmt.Sprintf("%d %d", cpuQuota(l.CPUs), cpuPeriodMicros)})
	}
	return s
}

// Started gives sandbox id's init, once it is built, the CPU weight of
// every running sandbox. Create gives it a much larger one (startSharesV1,
// startWeightV2) for its start: a new sandbox's init then runs ahead of
// busy sandboxes (it is the only process in its cgroup then, and its
// commands' cgroup keeps its CPU limit), so a create stays quick while
// others' sandboxes keep the CPUs busy.
func (p *Plan) Started(id string) error { return p.weigh(id, runSharesV1, runWeightV2) }

// Idle gives sandbox id's init a low CPU weight (idleSharesV1): a warm sandbox's,
// from its build until its claim (Started then). A refill then takes
// only the CPU that the creates claiming warm sandboxes, their first
// commands and the running sandboxes leave (issue 41, row 11e).
func (p *Plan) Idle(id string) error { return p.weigh(id, idleSharesV1, idleWeightV2) }

// weigh sets the CPU weight of sandbox id's init cgroup: shares on v1,
// weight on v2.
func (p *Plan) weigh(id string, shares, weight int) error {
	for _, h := range p.v1 {
		if slices.Contains(h.ctls, "cpu") {
			if err := (setting{filepath.Join(h.mount, "sandgate", id), "cpu.shares", strconv.Itoa(shares)}).write(); err != nil {
				return err
			}
		}
	}
	if p.v2 != "" && slices.Contains(p.v2Ctls, "cpu") {
		return setting{filepath.Join(p.v2, "sandgate", id), "cpu.weight", strconv.Itoa(weight)}.write()
	}
	return nil
}

// SetLimits changes the limits of sandbox id's cgroups, which Create made,
// while the sandbox runs (a warm sandbox bound to a session). Some files
// must stay ordered (an init's cgroup above its commands', memory below
// memory+swap), so the order that works depends on whether a limit goes
// up or down: what the kernel refuses is written again once the rest is,
// until nothing moves.
func (p *Plan) SetLimits(id string, l Limits) error {
	var pending []setting
	for _, h := range p.v1 {
		dir := filepath.Join(h.mount, "sandgate", id)
		for _, c := range h.ctls {
			pending = append(pending, settingsV1(c, dir, filepath.Join(dir, "procs"), l)...)
		}
	}
	if p.v2 != "" {
		dir := filepath.Join(p.v2, "sandgate", id)
		for _, c := range p.v2Ctls {
			pending = append(pending, settingsV2(c, dir, l)...)
		}
	}
	for len(pending) > 0 {
		var failed []setting
		var last error
		for _, x := range pending {
			if err := x.write(); err != nil {
				failed, last = append(failed, x), err
			}
		}
		if len(failed) == len(pending) {
			return last
		}
		pending = failed
	}
	return nil
}

func cpuQuota(cpus float64) int64 {
	return max(int64(cpus*cpuPeriodMicros), 1000)
}

// TaskFiles opens the tasks files of the init's cgroups (v1), for the
// thread that starts the init to join them first, and of the commands'
// cgroups, for the init's spawner thread. They are opened by the gateway,
// whose credentials the kernel checks for the moves. The init's cgroup of
// the cpu hierarchy is not among them: the init moves there (CPUTasks) once
// its root is built, unless withCPU: a warm sandbox's init (built for a
// pool, at the least CPU weight, Plan.Idle, once started) is born there
// too, as it should yield the CPU for all of its build, and then need not
// move itself (CPUTasks), whose wait for each of its threads costs CPU on
// a busy host (issue 41: 1.6 ms per build, spinning in sched_yield). The
// thread that starts it is in these cgroups until its exec: the least
// weight must wait until then (its fork took seconds among busy sandboxes).
func (c *Set) TaskFiles(withCPU bool) (inits, procs []int, err error) {
	open := func(dirs []string) ([]int, error) {
		var fds []int
		for _, dir := range dirs {
			fd, err := unix.Open(filepath.Join(dir, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				procio.CloseFDs(fds)
				return nil, fmt.Errorf("open cgroup file: %w", err)
			}
			fds = append(fds, fd)
		}
		return fds, nil
	}
	initDirs := c.inits
	if !withCPU {
		initDirs = slices.DeleteFunc(slices.Clone(c.inits), func(d string) bool { return d == c.cpuInit })
	}
	if inits, err = open(initDirs); err != nil {
		return nil, nil, err
	}
	if procs, err = open(c.procs); err != nil {
		procio.CloseFDs(inits)
		return nil, nil, err
	}
	return inits, procs, nil
}

// CPUTasks opens, for writing, the tasks file of the sandbox's cgroup of
// the v1 cpu hierarchy, which TaskFiles leaves out of the init's: -1 when
// there is none. The init joins it itself, once its root is built, each of
// its threads writing "0" (the writing thread alone), which skips the
// kernel's global threadgroup lock and its RCU grace period (5-20 ms here)
// that writing its pid to cgroup.procs from the gateway costs.
//
// A new init starts in the gateway's own CPU cgroup, not under the
// "sandgate" parent that every sandbox of the host shares: there, it would
// get a share of that parent's single weight only, which busy sandboxes
// (other tenants', other gateways') use up, and on a loaded host its start
// would wait for them (issue 34: another tenant's create under a flood).
// The init has no CPU limit of its own (its commands' cgroup has), so
// nothing is enforced later than before; the init moves before its
// spawner thread joins the commands' cgroups, and threads made later
// inherit the cgroup of the thread that makes them.
func (c *Set) CPUTasks() (int, error) {
	if c.cpuInit == "" {
		return -1, nil
	}
	fd, err := unix.Open(filepath.Join(c.cpuInit, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open cgroup file: %w", err)
	}
	return fd, nil
}

// threadTasks opens, for each v1 hierarchy of p, the tasks file of the
// cgroup the calling thread is in: for it to go back there.
func (p *Plan) threadTasks() ([]int, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, h := range p.v1 {
		found := false
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 || !slices.ContainsFunc(h.ctls, func(c string) bool { return slices.Contains(strings.Split(f[1], ","), c) }) {
				continue
			}
			fd, err := unix.Open(filepath.Join(h.mount, f[2], "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				procio.CloseFDs(fds)
				return nil, fmt.Errorf("own cgroup: %w", err)
			}
			fds, found = append(fds, fd), true
			break
		}
		if !found {
			procio.CloseFDs(fds)
			return nil, fmt.Errorf("no cgroup of this thread in the hierarchy at %s", h.mount)
		}
	}
	return fds, nil
}

// OpenV2 opens the v2 cgroup, to start the init in it (CLONE_INTO_CGROUP);
// -1 when there is none.
func (c *Set) OpenV2() (int, error) {
	if c.v2 == "" {
		return -1, nil
	}
	fd, err := unix.Open(c.v2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open cgroup: %w", err)
	}
	return fd, nil
}

// Remove removes dirs (children first). Tasks that just died may
// keep a cgroup busy for a moment. The cgroups are thawed first: a
// frozen task that was sent SIGKILL dies only once thawed.
func Remove(dirs []string) error {
	_, terr := Thaw(dirs)
	errs := []error{terr}
	for _, dir := range dirs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			break
		}
	}
	// The shared v1 parents go too once empty, so that a host without
	// sandboxes shows none of ours; Create makes them again. A v2 parent
	// stays: it carries the controllers enabled for its children.
	for _, dir := range dirs {
		parent := filepath.Dir(dir)
		if filepath.Base(parent) == "sandgate" && !isCgroup2(parent) {
			_ = unix.Rmdir(parent)
		}
	}
	return errors.Join(errs...)
}

// KillProcs sends SIGKILL to every process in dirs, which are the
// cgroups of one sandbox: its init first (killing the init ends its pid
// namespace), then anything else listed. It thaws them first (a frozen
// task ignores SIGKILL until thawed).
func KillProcs(dirs []string) {
	_, _ = Thaw(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		b, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
}

func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// DirsFor lists the cgroups sandbox id would have under plan p,
// children first: what a reap removes when the state file lacks them.
func (p *Plan) DirsFor(id string) []string {
	var procs, inits []string
	for _, h := range p.v1 {
		dir := filepath.Join(h.mount, "sandgate", id)
		procs = append(procs, filepath.Join(dir, "procs"))
		inits = append(inits, dir)
	}
	if p.v2 != "" {
		inits = append(inits, filepath.Join(p.v2, "sandgate", id))
	}
	return append(procs, inits...)
}

// Limits are what a sandbox's cgroups enforce.
type Limits struct {
	MemoryBytes int64
	Pids        int64
	CPUs        float64
}

// NewV2Plan is a plan that puts sandboxes in cgroup v2 at mount with no
// controller: the plumbing alone, for tests.
func NewV2Plan(mount string) (*Plan, error) {
	p := &Plan{v2: mount, via: map[string]string{}, missing: map[string]string{}}
	return p, os.MkdirAll(mount+"/sandgate", 0o755)
}

// Via says how this host enforces controller c ("cgroup v1", "cgroup v2"),
// or "" when it does not.
func (p *Plan) Via(c string) string { return p.via[c] }

// Missing says why this host does not enforce controller c.
func (p *Plan) Missing(c string) string { return p.missing[c] }

// StartJoined starts cmd in the cgroup v1 whose tasks files are open in
// tasks: from a thread that joins them first (a child starts in its parent
// thread's cgroups), then goes back where it was.
func (p *Plan) StartJoined(cmd *exec.Cmd, tasks []int) error {
	if len(tasks) == 0 {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := p.threadTasks()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer procio.CloseFDs(back)
		for _, fd := range tasks {
			// "0": the writing thread alone, this one.
			if _, err = unix.Write(fd, []byte("0")); err != nil {
				err = fmt.Errorf("join the sandbox's cgroup: %w", err)
				break
			}
		}
		if err == nil {
			err = cmd.Start()
		}
		for _, fd := range back {
			if _, berr := unix.Write(fd, []byte("0")); berr != nil {
				// Stuck in the sandbox's cgroups: the thread must not run
				// anything else. Still locked, it ends with this goroutine.
				errc <- errors.Join(err, fmt.Errorf("leave the sandbox's cgroup: %w", berr))
				return
			}
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
