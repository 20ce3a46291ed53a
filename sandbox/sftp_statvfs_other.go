//go:build !linux

package sandbox

import "github.com/pkg/sftp"

// StatVFS implements sftp.StatVFSFileCmder; only Linux answers it.
func (h *rootHandler) StatVFS(r *sftp.Request) (*sftp.StatVFS, error) {
	return nil, sftp.ErrSSHFxOpUnsupported
}
