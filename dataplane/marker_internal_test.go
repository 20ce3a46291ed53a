package dataplane

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestMarkerReaderForgedStart: a command that writes the start of its
// end marker (tok + ":"; it can learn tok: a DEBUG trap sees the
// __sandgate_done line, and a sync's marker waits in the shell's stdin,
// which the command running before it can read) and then output without
// the marker's end does not make the gateway hold that output in memory
// as the marker's status, without bound: past the longest status the
// start is output like any other, and the real marker after it is found.
// On the merged code the 8 MiB were held and returned as the status.
func TestMarkerReaderForgedStart(t *testing.T) {
	tok := newToken()
	flood := bytes.Repeat([]byte("x"), 8<<20)
	src := io.MultiReader(strings.NewReader("a"+tok+":"), bytes.NewReader(flood),
		strings.NewReader(tok+":0:/tmp:"+tok+"\nnext"))
	m := newMarkerReader(io.NopCloser(src))
	w := newStreamReader("stdout", Request{MaxOutputBytes: 1 << 10}, nil)
	status, ok := m.until(tok, w)
	if !ok || status != "0:/tmp" {
		t.Fatalf("status %.100q, %v; want \"0:/tmp\", true", status, ok)
	}
	if want := int64(1 + len(tok) + 1 + len(flood)); w.cap.total != want {
		t.Errorf("output passed on: %d bytes, want %d (the forged start and what followed it)", w.cap.total, want)
	}
	if string(m.left) != "next" {
		t.Errorf("left after the marker: %q", m.left)
	}

	// Forged starts one after another, output after them, then the real
	// marker: the same.
	var b strings.Builder
	for b.Len() < 1<<20 {
		b.WriteString(tok + ":")
	}
	b.WriteString(strings.Repeat("y", 256<<10))
	forged := b.String()
	m = newMarkerReader(io.NopCloser(strings.NewReader(forged + tok + "::" + tok + "\n")))
	w = newStreamReader("stderr", Request{MaxOutputBytes: 1 << 10}, nil)
	if status, ok := m.until(tok, w); !ok || status != "" || w.cap.total != int64(len(forged)) {
		t.Errorf("after forged starts and output: status %.100q, %v, %d bytes out, want \"\", true, %d", status, ok, w.cap.total, len(forged))
	}
}
