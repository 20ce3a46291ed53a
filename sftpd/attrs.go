package sftpd

import (
	"fmt"
	"io/fs"
	"os/user"
	"strconv"
	"syscall"
	"time"
)

// Mode bits of stat(2), which SFTP carries as they are.
const (
	sIFMT   = 0o170000
	sIFSOCK = 0o140000
	sIFLNK  = 0o120000
	sIFREG  = 0o100000
	sIFBLK  = 0o060000
	sIFDIR  = 0o040000
	sIFCHR  = 0o020000
	sIFIFO  = 0o010000
)

// fileAttrs is the ATTRS of a file: size, owner, mode and times.
func fileAttrs(fi fs.FileInfo) attrs {
	a := attrs{
		flags: attrSize | attrPermissions | attrACModTime,
		size:  uint64(fi.Size()),
		perm:  modeToUnix(fi.Mode()),
		atime: uint32(fi.ModTime().Unix()),
		mtime: uint32(fi.ModTime().Unix()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		a.flags |= attrUIDGID
		a.uid, a.gid = st.Uid, st.Gid
		a.perm = uint32(st.Mode)
		at, mt := statTimes(st)
		a.atime, a.mtime = uint32(at), uint32(mt)
	}
	return a
}

// modeToUnix maps a FileMode to stat(2) mode bits.
func modeToUnix(m fs.FileMode) uint32 {
	v := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	switch {
	case m.IsDir():
		v |= sIFDIR
	case m&fs.ModeSymlink != 0:
		v |= sIFLNK
	case m&fs.ModeNamedPipe != 0:
		v |= sIFIFO
	case m&fs.ModeSocket != 0:
		v |= sIFSOCK
	case m&fs.ModeCharDevice != 0:
		v |= sIFCHR
	case m&fs.ModeDevice != 0:
		v |= sIFBLK
	default:
		v |= sIFREG
	}
	return v
}

// unixToMode maps the permission bits of an SFTP mode to a FileMode.
func unixToMode(v uint32) fs.FileMode {
	m := fs.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// longname is the `ls -l` line of READDIR, in OpenSSH's layout.
func (s *server) longname(name string, fi fs.FileInfo, a attrs, now time.Time) string {
	nlink := uint64(1)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		nlink = uint64(st.Nlink)
	}
	mt := time.Unix(int64(a.mtime), 0)
	layout := "Jan _2 15:04"
	if d := now.Sub(mt); d > 182*24*time.Hour || d < -182*24*time.Hour {
		layout = "Jan _2  2006"
	}
	// OpenSSH's mode field is 11 wide (strmode leaves a column for an
	// ACL mark), hence two spaces after it.
	return fmt.Sprintf("%s  %3d %-8s %-8s %8d %s %s", modeString(a.perm), nlink,
		orNumber(s.names.user(a.uid), a.uid), orNumber(s.names.group(a.gid), a.gid), a.size, mt.Format(layout), name)
}

// modeString is ls's ten-character mode: type, then rwx with s/S and t/T.
func modeString(v uint32) string {
	// The type's letter, indexed by the S_IFMT bits: 1 FIFO, 2 char device,
	// 4 dir, 6 block device, 8 regular, 10 symlink, 12 socket.
	const types = "?pc?d?b?-?l?s???"
	b := []byte("?rwxrwxrwx")
	b[0] = types[(v&sIFMT)>>12]
	for i := 0; i < 9; i++ {
		if v&(1<<(8-i)) == 0 {
			b[1+i] = '-'
		}
	}
	special := func(pos int, bit uint32, set, unset byte) {
		if v&bit == 0 {
			return
		}
		if b[pos] == '-' {
			b[pos] = unset
		} else {
			b[pos] = set
		}
	}
	special(3, 0o4000, 's', 'S')
	special(6, 0o2000, 's', 'S')
	special(9, 0o1000, 't', 'T')
	return string(b)
}

// nameCache maps uids and gids to the system's names for them, "" where
// it has none; longname shows the number then.
type nameCache struct {
	users, groups map[uint32]string
}

func newNameCache() *nameCache {
	return &nameCache{users: map[uint32]string{}, groups: map[uint32]string{}}
}

func (c *nameCache) user(uid uint32) string {
	return cachedName(c.users, uid, func(id string) (string, error) {
		u, err := user.LookupId(id)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (c *nameCache) group(gid uint32) string {
	return cachedName(c.groups, gid, func(id string) (string, error) {
		g, err := user.LookupGroupId(id)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

// cachedName looks id up once; a failed lookup caches "".
func cachedName(cache map[uint32]string, id uint32, lookup func(string) (string, error)) string {
	if n, ok := cache[id]; ok {
		return n
	}
	n, err := lookup(strconv.FormatUint(uint64(id), 10))
	if err != nil {
		n = ""
	}
	cache[id] = n
	return n
}

// orNumber is name, or id when the system has no name for it.
func orNumber(name string, id uint32) string {
	if name == "" {
		return strconv.FormatUint(uint64(id), 10)
	}
	return name
}
