//go:build linux

package linuxns

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/sandgate/sandgate/internal/cgroup"
	"github.com/sandgate/sandgate/sandbox"
)

// NewWithInit is New with init as the embedded small init, as make build
// embeds one (the test binary has none).
func NewWithInit(cfg sandbox.Config, init []byte) (*Driver, error) { return newDriver(cfg, init) }

// SetSocketCheck shortens how often d's new inits check their control socket.
func (d *Driver) SetSocketCheck(every time.Duration) { d.sockCheck = every }

// UseTmpfsWorkspaces makes d's new sandboxes use the tmpfs workspace of
// hosts without mkfs.ext4 or loop devices.
func (d *Driver) UseTmpfsWorkspaces() {
	d.ws = &workspaces{size: d.ws.size, reason: "test"}
}

// UseCgroupV2 makes d put its new sandboxes in cgroup v2 at mount (with no
// controllers: this tests the plumbing, not the limits).
func (d *Driver) UseCgroupV2(mount string) error {
	p, err := cgroup.NewV2Plan(mount)
	d.cg = p
	return err
}

// NoEtcTemplate makes d's new sandboxes build their /etc in their init,
// as on a kernel that cannot clone a detached mount.
func (d *Driver) NoEtcTemplate() { d.etc = nil }

// SetEtcCheck shortens how often d's creates check that the host files
// its /etc template, and its checkpointable sandboxes' /etc dir, copied
// are unchanged.
func (d *Driver) SetEtcCheck(every time.Duration) {
	d.etc.mu.Lock()
	d.etc.every = every
	d.etc.mu.Unlock()
	d.etcDirs.mu.Lock()
	d.etcDirs.every = every
	d.etcDirs.mu.Unlock()
}

// BeforeAttach makes d call f with each new init's pid just before it
// sends it its workspace (and its CPU cgroup to move into).
func (d *Driver) BeforeAttach(f func(pid int)) { d.beforeAttach = f }

// BeforeLaunch makes d call f with each new sandbox's id just before it
// forks its init, in the cgroups made for it.
func (d *Driver) BeforeLaunch(f func(id string)) { d.beforeLaunch = f }

// BeforeKill makes d call f with a sandbox's id just before its teardown
// (Destroy, a failed Create) or a reap (Remove, Open's) kills its init.
func (d *Driver) BeforeKill(f func(id string)) { d.beforeKill = f }

// DisableSeccomp starts the driver's next sandboxes without the seccomp
// filter, to measure what it costs.
func (d *Driver) DisableSeccomp() { d.noSeccomp = true }

// DropSeccompProgram sends the driver's next sandboxes specs without the
// filter's program (and without NoSeccomp), as a broken gateway would.
func (d *Driver) DropSeccompProgram() { d.seccompProg = nil }

// DropControl closes p's control connection and its stdio as a gateway
// that dies does, without asking the init for anything.
func DropControl(p sandbox.Process) {
	ip := p.(*initProcess)
	ip.conn.Close() // first: closing a kept stdin sends nothing then
	ip.closeStdio()
}

// NftRules counts the rules of the sandbox's transparent-egress nftables
// table, by chain.
func NftRules(sb sandbox.Sandbox) (map[string]int, error) {
	s := sb.(*linuxSandbox)
	s.mu.Lock()
	pid := s.st.Pid
	s.mu.Unlock()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return nil, err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: nftTable}
	out := map[string]int{}
	for _, chain := range []string{"nat_out", "filter_out"} {
		rules, err := c.GetRules(tbl, &nftables.Chain{Name: chain, Table: tbl})
		if err != nil {
			return nil, err
		}
		out[chain] = len(rules)
	}
	return out, nil
}

// RestoreStagesDir is where d stages its restores (stagesDir).
func (d *Driver) RestoreStagesDir() string { return d.stagesDir() }

// Kerndat is d's copy of CRIU's kerndat cache (runCRIU), or nil.
func (d *Driver) Kerndat() []byte {
	d.kdatMu.Lock()
	defer d.kdatMu.Unlock()
	return d.kdat
}

// OwnRun says whether d's criu runs get a /run of their own (runCRIU).
func (d *Driver) OwnRun(criu string) bool { return d.ownRun(criu) }

// HoldPauseDumps takes every slot of MaxPauseDumps, as that many pauses
// by checkpoint under way would; the returned function lets them go.
func (d *Driver) HoldPauseDumps() func() {
	for range MaxPauseDumps {
		d.pauseDumps <- struct{}{}
	}
	return func() {
		for range MaxPauseDumps {
			<-d.pauseDumps
		}
	}
}

// CheckConfined runs a restore's confinement check (checkConfined) on
// running sandbox sb, as its state says, but for pid, uidBase and the
// cgroups of sandbox id in place of its own where not zero.
func CheckConfined(sb sandbox.Sandbox, pid, uidBase int, id string) error {
	s := sb.(*linuxSandbox)
	s.mu.Lock()
	st := *s.st
	st.Cgroups = slices.Clone(st.Cgroups)
	s.mu.Unlock()
	if pid != 0 {
		st.Pid = pid
	}
	if uidBase != 0 {
		st.UIDBase = uidBase
	}
	if id != "" {
		for i, dir := range st.Cgroups {
			st.Cgroups[i] = strings.Replace(dir, "/sandgate/"+st.ID, "/sandgate/"+id, 1)
		}
	}
	_, err := checkConfined(&st)
	return err
}

// NoSpawner makes d fork its inits itself, as without the small init.
func (d *Driver) NoSpawner() { d.spawner = nil }
