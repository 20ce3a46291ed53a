// Package mountinfo parses /proc/self/mountinfo.
package mountinfo

import (
	"strconv"
	"strings"
)

// Entry is a line of /proc/self/mountinfo.
type Entry struct {
	Point, FSType, Source, SuperOpts string
}

// Parse parses one line of /proc/self/mountinfo.
func Parse(line string) (Entry, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Entry{}, false
	}
	a, b := strings.Fields(pre), strings.Fields(post)
	if len(a) < 5 || len(b) < 3 {
		return Entry{}, false
	}
	return Entry{Point: unescape(a[4]), FSType: b[0], Source: b[1], SuperOpts: b[2]}, true
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
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
