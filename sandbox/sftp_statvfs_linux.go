//go:build linux

package sandbox

import (
	"github.com/pkg/sftp"
	"golang.org/x/sys/unix"
)

// StatVFS implements sftp.StatVFSFileCmder (OpenSSH's `df`).
func (h *rootHandler) StatVFS(r *sftp.Request) (*sftp.StatVFS, error) {
	f, err := h.root.Open(rel(r.Filepath))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	return &sftp.StatVFS{
		Bsize: uint64(st.Bsize), Frsize: uint64(st.Frsize),
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree, Favail: st.Ffree,
		Fsid: uint64(uint32(st.Fsid.Val[0])) | uint64(uint32(st.Fsid.Val[1]))<<32,
		Flag: uint64(st.Flags), Namemax: uint64(st.Namelen),
	}, nil
}
