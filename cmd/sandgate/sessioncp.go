package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/pkg/sftp"
	"github.com/spf13/cobra"
)

func newSessionCpCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy files or directories between here and a session (ID|NAME:PATH), over SFTP",
		Long: `Copy a file or a directory tree into or out of a session, over SFTP
through the gateway's tunnel. The session side is ID|NAME:PATH, as with
scp (a relative PATH is below /workspace); the other side is a local path.
Directories are copied recursively. When DST is an existing directory the
copy goes inside it, under SRC's base name; otherwise it becomes DST.

  sandgate session cp ./src dev:project     # local to session
  sandgate session cp dev:out/report.txt .  # session to local`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcRef, srcPath, srcRemote := splitRemote(args[0])
			dstRef, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return usageErrorf("exactly one of SRC and DST must be in a session (ID|NAME:PATH)")
			}
			ref := srcRef
			if dstRemote {
				ref = dstRef
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, _, err := c.getSession(ctx, ref)
			if err != nil {
				return err
			}
			client, err := c.sshClient(ctx, s)
			if err != nil {
				return err
			}
			defer client.Close()
			sc, err := sftp.NewClient(client, sftp.UseConcurrentWrites(true))
			if err != nil {
				return fmt.Errorf("sftp: %w", err)
			}
			defer sc.Close()
			local := localFS{}
			remote := remoteFS{sc}
			if dstRemote {
				return copyTree(ctx, cmd.ErrOrStderr(), local, srcPath, remote, remotePath(dstPath))
			}
			return copyTree(ctx, cmd.ErrOrStderr(), remote, remotePath(srcPath), local, dstPath)
		},
	}
}

// splitRemote splits ID|NAME:PATH as scp does: a colon before any slash
// makes it remote.
func splitRemote(arg string) (ref, p string, remote bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.Contains(arg[:i], "/") {
		return "", arg, false
	}
	return arg[:i], arg[i+1:], true
}

func remotePath(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// side is one end of a copy: the local file system or the session's.
type side interface {
	Stat(p string) (fs.FileInfo, error)
	ReadDir(p string) ([]fs.FileInfo, error)
	Open(p string) (io.ReadCloser, error)
	Create(p string, mode fs.FileMode) (io.WriteCloser, error)
	Mkdir(p string, mode fs.FileMode) error
	Join(elem ...string) string
	Base(p string) string
}

type localFS struct{}

func (localFS) Stat(p string) (fs.FileInfo, error) { return os.Stat(p) }
func (localFS) ReadDir(p string) ([]fs.FileInfo, error) {
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	out := make([]fs.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}
func (localFS) Open(p string) (io.ReadCloser, error) { return os.Open(p) }
func (localFS) Create(p string, mode fs.FileMode) (io.WriteCloser, error) {
	return os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode.Perm())
}
func (localFS) Mkdir(p string, mode fs.FileMode) error {
	err := os.Mkdir(p, mode.Perm()|0o700)
	if errors.Is(err, fs.ErrExist) {
		if fi, serr := os.Stat(p); serr == nil && fi.IsDir() {
			return nil
		}
	}
	return err
}
func (localFS) Join(elem ...string) string { return filepath.Join(elem...) }
func (localFS) Base(p string) string       { return filepath.Base(p) }

type remoteFS struct{ c *sftp.Client }

func (r remoteFS) Stat(p string) (fs.FileInfo, error)      { return r.c.Stat(p) }
func (r remoteFS) ReadDir(p string) ([]fs.FileInfo, error) { return r.c.ReadDir(p) }
func (r remoteFS) Open(p string) (io.ReadCloser, error)    { return r.c.Open(p) }
func (r remoteFS) Create(p string, mode fs.FileMode) (io.WriteCloser, error) {
	f, err := r.c.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return nil, err
	}
	_ = f.Chmod(mode.Perm())
	return f, nil
}
func (r remoteFS) Mkdir(p string, mode fs.FileMode) error {
	err := r.c.Mkdir(p)
	if err != nil {
		if fi, serr := r.c.Stat(p); serr == nil && fi.IsDir() {
			return nil
		}
		return err
	}
	_ = r.c.Chmod(p, mode.Perm()|0o700)
	return nil
}
func (remoteFS) Join(elem ...string) string { return path.Join(elem...) }
func (remoteFS) Base(p string) string       { return path.Base(p) }

// copyTree copies src (a file or a directory, recursively) to dst: inside
// dst when dst is an existing directory, else as dst.
func copyTree(ctx context.Context, warn io.Writer, from side, src string, to side, dst string) error {
	fi, err := from.Stat(src)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if di, err := to.Stat(dst); err == nil && di.IsDir() {
		dst = to.Join(dst, from.Base(src))
	}
	return copyOne(ctx, warn, from, src, fi, to, dst)
}

func copyOne(ctx context.Context, warn io.Writer, from side, src string, fi fs.FileInfo, to side, dst string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		if err := to.Mkdir(dst, fi.Mode()); err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
		entries, err := from.ReadDir(src)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		for _, e := range entries {
			// A listing is the other side's word: a name must be one
			// entry of this directory, never a path out of it.
			if n := e.Name(); n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") {
				return fmt.Errorf("%s: the listing holds an entry named %q, which is not a file name", src, n)
			}
			if err := copyOne(ctx, warn, from, from.Join(src, e.Name()), e, to, to.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode().IsRegular():
		in, err := from.Open(src)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		defer in.Close()
		out, err := to.Create(dst, fi.Mode())
		if err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
		if err := out.Close(); err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
		return nil
	default:
		// Symbolic links (ReadDir does not follow them), devices, pipes.
		fmt.Fprintf(warn, "sandgate session cp: %s: skipped, not a regular file or directory (%s)\n", src, fi.Mode().Type())
		return nil
	}
}
