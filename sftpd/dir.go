package sftpd

import (
	"fmt"
	"io"
	"os"
	"path"
)

// DirOption tunes ServeDir.
type DirOption func(*dirOptions)

type dirOptions struct {
	start string
}

// WithStartDir sets the directory, as the client sees paths, that relative
// paths start from and that `realpath .` answers (default "/").
func WithStartDir(dir string) DirOption {
	return func(o *dirOptions) { o.start = path.Clean("/" + dir) }
}

// ServeDir serves the SFTP protocol on rw with every path resolved inside
// dir through os.Root: "..", absolute symlinks and symlinked directories that
// point outside dir are refused by the kernel-backed resolver, not by text checks.
// Clients see dir as "/". It returns when the client goes away.
//
// A dir of "/" means the process's whole filesystem, which only makes sense
// where the kernel confines the process (a linux sandbox: its own mount
// namespace, the sandbox user): then paths are served as they are, like
// OpenSSH's sftp-server does, so absolute symlinks inside it work.
func ServeDir(dir string, rw io.ReadWriteCloser, opts ...DirOption) error {
	o := dirOptions{start: "/"}
	for _, opt := range opts {
		opt(&o)
	}
	so := Options{StartDir: o.start}
	if dir != "/" {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("open sftp root: %w", err)
		}
		defer root.Close()
		so.Root = root
	}
	if err := Serve(rw, rw, so); err != nil {
		return fmt.Errorf("sftp: %w", err)
	}
	return nil
}
