// Package linuxns is the linux namespace sandbox driver, gateway side: it
// runs in the gateway process and makes each session's sandbox a
// per-session init, `sandgate sandbox-init` (package initd), cloned from
// the gateway's own binary in new user, mount, pid, net, ipc and uts
// namespaces, in cgroups of its own.
//
// Where things are:
//   - driver_linux.go: Driver (New, the start-up probe, Report), Create,
//     and the sandboxes left by an earlier gateway (List, Adopt, Remove);
//   - sandbox_linux.go: a sandbox (Start over a new connection to the
//     init's control socket, Destroy, Detach, Keeps and Reattach) and its
//     processes (initProcess); kept_linux.go: a kept process's streams;
//   - stop_linux.go (Stop, Resume), freeze_linux.go (Freeze for
//     snapshots), stats_linux.go (Stats), loopback_linux.go (DialLoopback:
//     a socket made inside the sandbox's network namespace);
//   - state_linux.go: the state file that lets a sandbox outlive its
//     gateway; workspace_linux.go: the workspace filesystems (sparse images
//     formatted once per size); rootfs_linux.go: an image's root, idmapped
//     layers under an overlay;
//   - interfaces_linux.go: the optional interfaces of package sandbox it
//     implements, checked at compile time.
//
// The two sides share only the wire protocol in sandbox/linuxns/ctl; this
// package never imports initd, nor initd this one. Off Linux, New fails
// (driver_other.go). docs/architecture.md ("The linuxns driver") tells the
// whole story.
package linuxns
