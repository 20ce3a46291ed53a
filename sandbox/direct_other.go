//go:build !unix

package sandbox

import "io/fs"

type owner struct{ uid, gid int }

func statOwner(fs.FileInfo) (owner, bool) { return owner{}, false }
