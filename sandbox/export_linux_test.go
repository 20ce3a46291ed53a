//go:build linux

package sandbox

import (
	"os"
	"time"
)

// SetSocketCheck shortens how often d's new inits check their control socket.
func (d *Linux) SetSocketCheck(every time.Duration) { d.sockCheck = every }

// UseTmpfsWorkspaces makes d's new sandboxes use the tmpfs workspace of
// hosts without mkfs.ext4 or loop devices.
func (d *Linux) UseTmpfsWorkspaces() {
	d.ws = &workspaces{size: d.ws.size, reason: "test"}
}

// UseCgroupV2 makes d put its new sandboxes in cgroup v2 at mount (with no
// controllers: this tests the plumbing, not the limits).
func (d *Linux) UseCgroupV2(mount string) error {
	d.cg = &cgroupPlan{v2: mount, via: map[string]string{}, missing: map[string]string{}}
	return os.MkdirAll(mount+"/sandgate", 0o755)
}
