package sftpd

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
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
		f, err := s.fs.OpenFile(p, pathFlags, 0)
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
		if r, err := s.realpath(p); err != nil {
			s.fail(id, err)
		} else {
			s.replyName(id, r)
		}
	case "home-directory":
		u := d.string()
		if d.err != nil {
			return
		}
		// The sandbox has one user; its home is the start dir.
		if u != "" && u != s.names.user(uint32(os.Getuid())) {
			s.status(id, fxNoSuchFile, "No such user")
			return
		}
		s.replyName(id, s.start)
	case "users-groups-by-id@openssh.com":
		s.usersGroups(id, d)
	case "copy-data":
		s.copyData(id, d)
	default:
		s.status(id, fxOpUnsupported, "Operation unsupported: "+name)
	}
}

// usersGroups answers users-groups-by-id@openssh.com: the names of lists
// of uids and gids, "" for those the system does not know.
func (s *server) usersGroups(id uint32, d *decoder) {
	uids, gids := &decoder{b: d.bytes()}, &decoder{b: d.bytes()}
	if d.err != nil {
		return
	}
	var users, groups encoder
	for len(uids.b) > 0 && uids.err == nil {
		users = users.string(s.names.user(uids.uint32()))
	}
	for len(gids.b) > 0 && gids.err == nil {
		groups = groups.string(s.names.group(gids.uint32()))
	}
	if uids.err != nil || gids.err != nil {
		d.err = errShort
		return
	}
	at := s.begin(fxpExtendedReply, id)
	s.out = s.out.string(string(users)).string(string(groups))
	s.end(at)
}

// copyData answers copy-data: length bytes (0: to the end) from one open
// file to another, at their offsets, without the data crossing the wire.
func (s *server) copyData(id uint32, d *decoder) {
	rh, rerr := s.handle(d.bytes(), false)
	roff, length := d.uint64(), d.uint64()
	wh, werr := s.handle(d.bytes(), false)
	woff := d.uint64()
	if d.err != nil {
		return
	}
	switch {
	case rerr != nil:
		s.fail(id, rerr)
		return
	case werr != nil:
		s.fail(id, werr)
		return
	case roff > 1<<63-1 || woff > 1<<63-1:
		s.fail(id, syscall.EINVAL)
		return
	}
	n := uint64(1<<63-1) - roff // to the end
	if length != 0 && length < n {
		n = length
	}
	// Overlapping ranges of one file would read bytes already overwritten.
	if rh == wh && roff < satAdd(woff, n) && woff < satAdd(roff, n) {
		s.fail(id, errOverlap)
		return
	}
	var dst io.Writer = io.NewOffsetWriter(wh.f, int64(woff))
	if wh.append {
		dst = wh.f
	}
	buf := make([]byte, maxData)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, io.NewSectionReader(rh.f, int64(roff), int64(n)), buf)
	s.result(id, err)
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
// handle (then through the descriptor, whatever the name has become), in
// OpenSSH's order: size, permissions, times, owner. follow is false for
// lsetstat, which changes a symlink itself.
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
		var err error
		switch {
		case link:
			err = errLsetstatSize
		case a.size > 1<<63-1:
			err = syscall.EFBIG
		case f != nil:
			err = f.Truncate(int64(a.size))
		default:
			err = s.fs.Truncate(name, int64(a.size))
		}
		if err != nil {
			return err
		}
	}
	if a.flags&attrPermissions != 0 {
		mode := unixToMode(a.perm)
		var err error
		switch {
		case s.privileged && mode&(fs.ModeSetuid|fs.ModeSetgid) != 0:
			err = errSetID
		case link:
			err = errors.ErrUnsupported // Linux has no mode on a symlink
		case f != nil:
			err = f.Chmod(mode)
		default:
			err = s.fs.Chmod(name, mode)
		}
		if err != nil {
			return err
		}
	}
	if a.flags&attrACModTime != 0 {
		at, mt := time.Unix(int64(a.atime), 0), time.Unix(int64(a.mtime), 0)
		var err error
		switch {
		case link:
			err = s.fs.LChtimes(name, at, mt)
		case f != nil:
			err = futimes(f, int64(a.atime), int64(a.mtime))
		default:
			err = s.fs.Chtimes(name, at, mt)
		}
		if err != nil {
			return err
		}
	}
	if a.flags&attrUIDGID != 0 {
		if err := s.chown(name, f, a.uid, a.gid, link); err != nil {
			return err
		}
	}
	return nil
}

// chown changes the owner. A privileged server (root, confined by a root:
// the workdir driver under a root gateway) would hand files to any host
// user, so it changes nothing and only accepts the file's current owner;
// elsewhere the kernel decides.
func (s *server) chown(name string, f *os.File, uid, gid uint32, link bool) error {
	if s.privileged {
		var fi fs.FileInfo
		var err error
		switch {
		case f != nil:
			fi, err = f.Stat()
		case link:
			fi, err = s.fs.Lstat(name)
		default:
			fi, err = s.fs.Stat(name)
		}
		if err != nil {
			return err
		}
		if a := fileAttrs(fi); a.flags&attrUIDGID == 0 || a.uid != uid || a.gid != gid {
			return fs.ErrPermission
		}
		return nil
	}
	switch {
	case link:
		return s.fs.Lchown(name, int(uid), int(gid))
	case f != nil:
		return f.Chown(int(uid), int(gid))
	default:
		return s.fs.Chown(name, int(uid), int(gid))
	}
}

// satAdd is a+b, or the largest uint64 where that overflows.
func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return 1<<64 - 1
	}
	return a + b
}
