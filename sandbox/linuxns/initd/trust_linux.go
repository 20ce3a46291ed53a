//go:build linux

package initd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox"
)

// trustStores are the system trust bundles of the common distributions,
// relative to /etc: Debian, Ubuntu and Alpine; Fedora and RHEL; others.
var trustStores = []string{
	"ssl/certs/ca-certificates.crt",
	"pki/tls/certs/ca-bundle.crt",
	"ssl/cert.pem",
	"ssl/ca-bundle.pem",
}

// maxTrustStore bounds the system bundle read into the sandbox's own.
const maxTrustStore = 8 << 20

// bundleName is sandbox.TrustBundle's name within /etc.
var bundleName = strings.TrimPrefix(sandbox.TrustBundle, "/etc/")

// hostTrust adds pem to the default root's trust store: the sandbox's
// /etc at etc (a tmpfs still writable) gets TrustBundle, the host's
// bundle plus pem, and that file is bound read-only over the bundle the
// host's /etc/ssl shows, so tools that read the system store trust pem
// too. The host's store itself is never written.
func hostTrust(etc, pem string) error {
	system, store := systemBundle("/etc")
	bundle := filepath.Join(etc, bundleName)
	if err := os.WriteFile(bundle, joinPEM(system, pem), 0o644); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if store == "" {
		return nil
	}
	if err := roBind(bundle, filepath.Join(etc, store)); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	return nil
}

// imageTrust adds pem to an image root's trust store, from inside the
// sandbox (after pivot_root, so the image's symlinks resolve within it):
// TrustBundle gets the image's bundle plus pem, and pem is appended to the
// image's own bundle where that is a regular file reached without a
// symlink. Both writes land in the session's writable layer.
func imageTrust(pem string) error {
	system, store := systemBundle("/etc")
	if err := os.WriteFile(sandbox.TrustBundle, joinPEM(system, pem), 0o644); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if store == "" {
		return nil
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join("/etc", store), &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_APPEND | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil // a symlinked store: the bundle and the env vars still work
	}
	f := os.NewFile(uintptr(fd), store)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	if _, err := f.WriteString("\n" + pem); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	return nil
}

// systemBundle reads the first trust bundle of trustStores under etc that
// is a regular file, and returns it with its path relative to etc; none
// found is empty.
func systemBundle(etc string) ([]byte, string) {
	for _, rel := range trustStores {
		if b, err := readRegular(filepath.Join(etc, rel), maxTrustStore); err == nil {
			return b, rel
		}
	}
	return nil, ""
}

// readRegular reads the regular file p, at most max bytes; anything else
// (a FIFO, a device) is an error, and is never blocked on.
func readRegular(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	return io.ReadAll(io.LimitReader(f, max))
}

func joinPEM(system []byte, pem string) []byte {
	out := append([]byte(nil), system...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, pem...)
}

// addTrust adds pem to the trust store of a running sandbox of the
// default root, as buildEtc does at build: a warm sandbox bound to a
// session with secrets bound to hosts. /etc is writable only meanwhile.
// It runs in a goroutine of its own, off the spawner thread that serves
// the control socket (its goroutine holds it locked): that thread is under
// the seccomp filter, which refuses mounts.
func addTrust(pem string, template bool) error {
	if pem == "" {
		return errors.New("no certificate to trust")
	}
	errc := make(chan error, 1)
	go func() { errc <- addTrustHere(pem, template) }()
	return <-errc
}

func addTrustHere(pem string, template bool) error {
	if template {
		// The gateway's shared /etc template: TrustBundle is there, empty
		// until a bundle is bound over it, from the sandbox's own / (made
		// writable for the moment).
		if fi, err := os.Stat(sandbox.TrustBundle); err != nil || fi.Size() > 0 {
			return errors.New("the sandbox trusts a session CA already")
		}
		if err := setWritable("/"); err != nil {
			return err
		}
		err := bindOwn("/", trustFiles("/etc", pem))
		return errors.Join(err, setReadOnly("/"))
	}
	if _, err := os.Lstat(sandbox.TrustBundle); err == nil {
		return errors.New("the sandbox trusts a session CA already")
	}
	if err := setWritable("/etc"); err != nil {
		return err
	}
	if err := hostTrust("/etc", pem); err != nil {
		_ = setReadOnly("/etc")
		return err
	}
	return setReadOnly("/etc")
}

// setWritable undoes setReadOnly on the mount at p.
func setWritable(p string) error {
	attr := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, p, 0, attr); err != nil {
		flags := (lockedFlags(p) &^ unix.MS_RDONLY) | unix.MS_BIND | unix.MS_REMOUNT
		if err := unix.Mount("", p, "", flags, ""); err != nil {
			return fmt.Errorf("make %s writable: %w", p, err)
		}
	}
	return nil
}
