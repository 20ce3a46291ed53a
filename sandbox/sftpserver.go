package sandbox

import (
	"fmt"
	"io"
	"os"
	"path"

	"github.com/sandgate/sandgate/sandbox/sftpd"
)

// SFTPOption tunes ServeSFTP.
type SFTPOption func(*sftpOptions)

type sftpOptions struct {
	start string
}

// SFTPStartDir sets the directory, as the client sees paths, that relative
// paths start from and that `realpath .` answers (default "/").
func SFTPStartDir(dir string) SFTPOption {
	return func(o *sftpOptions) { o.start = path.Clean("/" + dir) }
}

// ServeSFTP serves the SFTP protocol on rw with every path resolved inside
// dir through os.Root: "..", absolute symlinks and symlinked directories that
// point outside dir are refused by the kernel-backed resolver, not by text checks.
// Clients see dir as "/". It returns when the client goes away.
//
// A dir of "/" means the process's whole filesystem, which only makes sense
// where the kernel confines the process (a linux sandbox: its own mount
// namespace, the sandbox user): then paths are served as they are, like
// OpenSSH's sftp-server does, so absolute symlinks inside it work.
func ServeSFTP(dir string, rw io.ReadWriteCloser, opts ...SFTPOption) error {
	o := sftpOptions{start: "/"}
	for _, opt := range opts {
		opt(&o)
	}
	so := sftpd.Options{StartDir: o.start}
	if dir != "/" {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("open sftp root: %w", err)
		}
		defer root.Close()
		so.Root = root
	}
	if err := sftpd.Serve(rw, rw, so); err != nil {
		return fmt.Errorf("sftp: %w", err)
	}
	return nil
}
