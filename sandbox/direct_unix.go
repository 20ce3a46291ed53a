//go:build unix

package sandbox

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

type owner struct{ uid, gid int }

func statOwner(fi fs.FileInfo) (owner, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(st.Uid), int(st.Gid)}, true
}

// searcher checks, as uid:gid (no supplementary groups), the directories
// a path's lookup goes through, each once.
type searcher struct {
	uid, gid int
	ok       map[string]bool
}

// lookup reports whether the user may look p up (every directory the
// kernel searches on the way, through symbolic links, lets the user
// through by its mode bits, none with an ACL), and, with enter, also go
// into p itself, a directory (chdir).
func (s *searcher) lookup(p string, enter bool) bool {
	if !filepath.IsAbs(p) {
		return false
	}
	cur := "/"
	rest := strings.Split(p, "/")
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if !s.dir(cur) {
			return false
		}
		if c == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		var st unix.Stat_t
		if err := unix.Lstat(next, &st); err != nil {
			return false
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if links++; links > 40 { // the kernel's limit: ELOOP
				return false
			}
			target, err := os.Readlink(next)
			if err != nil || target == "" {
				return false
			}
			if strings.HasPrefix(target, "/") {
				cur = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		cur = next
	}
	return !enter || s.dir(cur)
}

// dir reports whether the user may search directory d (its own mode
// bits, no ACL).
func (s *searcher) dir(d string) bool {
	if ok, seen := s.ok[d]; seen {
		return ok
	}
	ok := s.check(d)
	s.ok[d] = ok
	return ok
}

func (s *searcher) check(d string) bool {
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || hasACL(d) {
		return false
	}
	m := st.Mode
	switch {
	case s.uid == 0:
		return true
	case int(st.Uid) == s.uid:
		return m&0o100 != 0
	case int(st.Gid) == s.gid:
		return m&0o010 != 0
	default:
		return m&0o001 != 0
	}
}
