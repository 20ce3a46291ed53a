package linuxns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// An image sandbox keeps its writable layer on the workspace filesystem, so
// that what it writes anywhere counts against the one size limit: the
// filesystem's root holds home/ (the sandbox's /workspace) and .root/ with
// the overlay's upper and work dirs, which the sandbox never sees.
const (
	imageHome  = "home"
	imageUpper = ".root/upper"
	imageWork  = ".root/work"
)

// maxLayers bounds an image's layers (overlayfs stacks at most 500; the
// mount options must fit a page).
const maxLayers = 128

// prepareImageWorkspace lays out the workspace filesystem mounted at mnt
// for an image sandbox whose host uid base is base.
func prepareImageWorkspace(mnt string, base int) error {
	for _, d := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{imageHome, 0o755, base + 1000, base + 1000},
		{".root", 0o700, 0, 0},
		// The upper dir is the root directory of the sandbox: owned by
		// its root.
		{imageUpper, 0o755, base, base},
		{imageWork, 0o700, 0, 0},
	} {
		p := filepath.Join(mnt, d.path)
		if err := os.Mkdir(p, d.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("image workspace: %w", err)
		}
		if err := errors.Join(os.Chown(p, d.uid, d.gid), os.Chmod(p, d.mode)); err != nil {
			return fmt.Errorf("image workspace: %w", err)
		}
	}
	return nil
}

// imageRoot builds the root filesystem of an image sandbox on the host and
// returns a detached clone of it (nosuid, nodev) for the init to attach.
// Each of img's layers is bound read-only and idmapped through the
// sandbox's user namespace (userns, an open /proc/<init>/ns/user), so that
// the image's uid 0 is the sandbox's root and no host user; an overlay
// stacks them below the session's writable layer (mnt, the workspace
// filesystem). The host-side mounts under dir are detached again before it
// returns: the overlay keeps what it uses.
func imageRoot(dir, mnt string, img *sandbox.Image, userns int) (rootfs int, err error) {
	if len(img.Layers) == 0 || len(img.Layers) > maxLayers {
		return -1, fmt.Errorf("image %s has %d layers (1 to %d)", img.Name, len(img.Layers), maxLayers)
	}
	ldir := filepath.Join(dir, "l")
	if err := os.Mkdir(ldir, 0o700); err != nil {
		return -1, fmt.Errorf("image layers: %w", err)
	}
	var mounted []string
	defer func() {
		for _, m := range mounted {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}()
	lower := make([]string, len(img.Layers))
	for i, layer := range img.Layers {
		at := filepath.Join(ldir, strconv.Itoa(i))
		if err := os.Mkdir(at, 0o700); err != nil {
			return -1, fmt.Errorf("image layers: %w", err)
		}
		if err := idmapLayer(layer, at, userns); err != nil {
			return -1, err
		}
		mounted = append(mounted, at)
		lower[len(img.Layers)-1-i] = at // overlayfs wants the top first
	}
	root := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(root, 0o700); err != nil {
		return -1, fmt.Errorf("image root: %w", err)
	}
	if err := mountOverlay(dir, root, lower, filepath.Join(mnt, imageUpper), filepath.Join(mnt, imageWork)); err != nil {
		return -1, err
	}
	mounted = append(mounted, root)
	fd, err := unix.OpenTree(unix.AT_FDCWD, root, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone the image's root: %w", err)
	}
	return fd, nil
}

// mountOverlay mounts the overlay of lower (top first), upper and work at
// root, all directories below dir. The overlay shows its options to
// everyone who reads the mount table, the sandbox too (`mount`, /proc/mounts),
// so they name each directory relative to dir, from a thread whose working
// directory is dir alone: no host path of the data dir reaches the sandbox.
func mountOverlay(dir, root string, lower []string, upper, work string) error {
	rel := func(p string) (string, error) {
		r, err := filepath.Rel(dir, p)
		if err != nil || r == ".." || strings.HasPrefix(r, "../") || strings.ContainsAny(r, ",:") {
			return "", fmt.Errorf("mount the image's overlay: %s is not a plain directory below %s", p, dir)
		}
		return r, nil
	}
	paths := append(slices.Clone(lower), upper, work)
	for i, p := range paths {
		r, err := rel(p)
		if err != nil {
			return err
		}
		paths[i] = r
	}
	n := len(lower)
	opts := "lowerdir=" + strings.Join(paths[:n], ":") + ",upperdir=" + paths[n] + ",workdir=" + paths[n+1]
	errc := make(chan error, 1)
	go func() {
		// This thread gets a working directory of its own and ends with
		// the goroutine (never unlocked): the gateway's other threads
		// keep theirs.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("mount the image's overlay: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			errc <- fmt.Errorf("mount the image's overlay: %w", err)
			return
		}
		if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			errc <- fmt.Errorf("mount the image's overlay: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// idmapLayer mounts a read-only clone of the layer directory src at dst,
// with its ids mapped through the user namespace userns.
func idmapLayer(src, dst string, userns int) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("image layer %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("idmap image layer %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("image layer %s: %w", src, err)
	}
	return nil
}
