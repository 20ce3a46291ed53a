// Package mountinfo parses /proc/self/mountinfo.
package mountinfo

import (
	"strconv"
	"strings"
)

// Entry is a line of /proc/self/mountinfo. Point and Root are unescaped;
// Source is as the kernel wrote it (Unescape undoes that).
type Entry struct {
	Point, FSType, Source, SuperOpts string
	// Root is the mount's root within its filesystem, Dev its device
	// (major:minor), MountOpts the per-mount options (ro, nosuid...).
	Root, Dev, MountOpts string
	// Optional are the optional fields: shared:N, master:N, unbindable...
	Optional []string
}

// Parse parses one line of /proc/self/mountinfo.
func Parse(line string) (Entry, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Entry{}, false
	}
	a, b := strings.Fields(pre), strings.Fields(post)
	if len(a) < 6 || len(b) < 3 {
		return Entry{}, false
	}
	return Entry{Point: Unescape(a[4]), FSType: b[0], Source: b[1], SuperOpts: b[2],
		Root: Unescape(a[3]), Dev: a[2], MountOpts: a[5], Optional: a[6:]}, true
}

// Unescape undoes mountinfo's octal escapes (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
