package sftpd

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"time"
)

func (s *server) extended(id uint32, d *decoder) {
	name := d.string()
	if d.err != nil {
		return
	}
	switch name {
	case "posix-rename@openssh.com":
		oldname, newname := s.path(d.string()), s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Rename(oldname, newname, true))
		}
	case "hardlink@openssh.com":
		oldname, newname := s.path(d.string()), s.path(d.string())
		if d.err == nil {
			s.result(id, s.fs.Link(oldname, newname))
		}
	case "statvfs@openssh.com":
		p := s.path(d.string())
		if d.err != nil {
			return
		}
		f, err := s.fs.OpenFile(p, os.O_RDONLY, 0)
		if err != nil {
			s.fail(id, err)
			return
		}
		s.statvfs(id, f)
		f.Close()
	case "fstatvfs@openssh.com":
		h, err := s.anyHandle(d.bytes())
		if d.err != nil {
			return
		}
		if err != nil {
			s.fail(id, err)
			return
		}
		s.statvfs(id, h.f)
	case "fsync@openssh.com":
		h, err := s.handle(d.bytes(), false)
		if d.err != nil {
			return
		}
		if err == nil {
			err = h.f.Sync()
		}
		s.result(id, err)
	case "lsetstat@openssh.com":
		p := s.path(d.string())
		a := d.attrs()
		if d.err == nil {
			s.result(id, s.setstat(p, nil, a, false))
		}
	case "limits@openssh.com":
		at := s.begin(fxpExtendedReply, id)
		s.out = s.out.uint64(maxPacket).uint64(maxData).uint64(maxData).uint64(maxHandles)
		s.end(at)
	case "expand-path@openssh.com":
		p := d.string()
		if d.err != nil {
			return
		}
		// "~" is the start dir: a sandbox has one user, whose home it is.
		switch {
		case p == "~":
			p = s.start
		case strings.HasPrefix(p, "~/"):
			p = s.start + p[1:]
		case strings.HasPrefix(p, "~"):
			s.status(id, fxNoSuchFile, "No such user")
			return
		}
		s.replyName(id, s.path(p))
	default:
		s.status(id, fxOpUnsupported, "Operation unsupported: "+name)
	}
}

func (s *server) statvfs(id uint32, f *os.File) {
	v, err := statvfs(f)
	if err != nil {
		s.fail(id, err)
		return
	}
	at := s.begin(fxpExtendedReply, id)
	for _, x := range v {
		s.out = s.out.uint64(x)
	}
	s.end(at)
}

// setstat applies a's attributes to name, or to f when it is an open
// handle, in OpenSSH's order: size, permissions, times, owner. follow is
// false for lsetstat, which changes a symlink itself.
func (s *server) setstat(name string, f *os.File, a attrs, follow bool) error {
	link := false
	if !follow {
		fi, err := s.fs.Lstat(name)
		if err != nil {
			return err
		}
		link = fi.Mode()&fs.ModeSymlink != 0
	}
	if a.flags&attrSize != 0 {
		switch {
		case link:
			return errLsetstatSize
		case a.size > 1<<63-1:
			return errors.New("size out of range")
		case f != nil:
			if err := f.Truncate(int64(a.size)); err != nil {
				return err
			}
		default:
			t, err := s.fs.OpenFile(name, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			err = t.Truncate(int64(a.size))
			t.Close()
			if err != nil {
				return err
			}
		}
	}
	if a.flags&attrPermissions != 0 {
		var err error
		switch {
		case link:
			err = errors.ErrUnsupported // Linux has no mode on a symlink
		case f != nil:
			err = f.Chmod(unixToMode(a.perm))
		default:
			err = s.fs.Chmod(name, unixToMode(a.perm))
		}
		if err != nil {
			return err
		}
	}
	if a.flags&attrACModTime != 0 {
		at, mt := time.Unix(int64(a.atime), 0), time.Unix(int64(a.mtime), 0)
		var err error
		if link {
			err = s.fs.LChtimes(name, at, mt)
		} else {
			err = s.fs.Chtimes(name, at, mt)
		}
		if err != nil {
			return err
		}
	}
	if a.flags&attrUIDGID != 0 {
		if err := s.chown(name, f, int(a.uid), int(a.gid), link); err != nil {
			return err
		}
	}
	return nil
}

// chown changes the owner. A confined server running as root (the workdir
// driver under a root gateway) would hand files to any host user, so it
// only takes a change to its own ids or the file's current ones; elsewhere
// the kernel decides.
func (s *server) chown(name string, f *os.File, uid, gid int, link bool) error {
	if s.fs.root != nil && os.Geteuid() == 0 && (uid != os.Getuid() || gid != os.Getgid()) {
		var fi fs.FileInfo
		var err error
		if link {
			fi, err = s.fs.Lstat(name)
		} else {
			fi, err = s.fs.Stat(name)
		}
		if err != nil {
			return err
		}
		a := fileAttrs(fi)
		if a.flags&attrUIDGID == 0 || int(a.uid) != uid || int(a.gid) != gid {
			return fs.ErrPermission
		}
	}
	switch {
	case link:
		return s.fs.Lchown(name, uid, gid)
	case f != nil:
		return f.Chown(uid, gid)
	default:
		return s.fs.Chown(name, uid, gid)
	}
}
