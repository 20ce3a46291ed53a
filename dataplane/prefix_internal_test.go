package dataplane

import (
	"strings"
	"testing"
	"testing/iotest"
)

// TestStreamReaderPrefix: the gateway's first stderr line (the token and
// the directory) is taken out wherever the shell's own warnings put it,
// and what comes before it stays; read whole or a byte at a time.
// Before, a line before the token (bash's warning about a locale it
// cannot set) left the token line in the command's stderr and no cwd.
func TestStreamReaderPrefix(t *testing.T) {
	const tok = "__sandgate_tok"
	for _, c := range []struct{ in, out, prefix string }{
		{tok + "/work\nerr\n", "err\n", "/work"},
		{tok + "/work\n", "", "/work"},
		{"bash: warning: setlocale: LC_ALL: cannot change locale (xx)\n" + tok + "/w\nerr", "bash: warning: setlocale: LC_ALL: cannot change locale (xx)\nerr", "/w"},
		{"a\nb\n" + tok + "/w\n" + tok + "/x\n", "a\nb\n" + tok + "/x\n", "/w"},
		{"bash: line 1: cd: nosuch: No such file or directory\n", "bash: line 1: cd: nosuch: No such file or directory\n", ""},
		{"no newline", "no newline", ""},
		{tok[:5], tok[:5], ""},
		{"", "", ""},
		{strings.Repeat("x", maxBeforePrefix+10) + "\n" + tok + "/w\n", strings.Repeat("x", maxBeforePrefix+10) + "\n" + tok + "/w\n", ""},
	} {
		for _, oneByte := range []bool{false, true} {
			r := newStreamReader("stderr", Request{MaxOutputBytes: 1 << 20}, []byte(tok))
			if oneByte {
				r.copyFrom(iotest.OneByteReader(strings.NewReader(c.in)))
			} else {
				r.copyFrom(strings.NewReader(c.in))
			}
			if got := string(r.cap.output().Bytes()); got != c.out || r.prefix != c.prefix {
				t.Errorf("%.80q (one byte %v): got %.80q and %q, want %.80q and %q", c.in, oneByte, got, r.prefix, c.out, c.prefix)
			}
		}
	}
}
