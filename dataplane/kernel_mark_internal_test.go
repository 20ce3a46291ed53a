package dataplane

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// TestKernelTakenBackInsideFrame: an interpreter taken back with its
// channel cut inside a frame (a reader let go of it there, as a pause
// may during a cell) is found again at the frame boundary its mark
// makes: the earlier cell's rest is read away, and the next cell's
// frames and the state are whole. Without the mark (a driver before it)
// the rest of the frame reads as a broken channel.
func TestKernelTakenBackInsideFrame(t *testing.T) {
	m := gateway.NewManager(gateway.Config{}, mustWorkdir(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	s, _, err := m.Create(context.Background(), gateway.Principal{Tenant: "t", Method: "api_key"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Start(context.Background(), sandbox.Cmd{Command: kernelCommand()}, startOwn)
	if err != nil {
		t.Fatal(err)
	}
	raw := &kernelProc{p: p}
	r := p.Stdout()
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || hdr[0] != 'J' { // ready
		t.Fatalf("ready: %q %v", hdr, err)
	}
	if _, err := io.ReadFull(r, make([]byte, int(hdr[1])<<24|int(hdr[2])<<16|int(hdr[3])<<8|int(hdr[4]))); err != nil {
		t.Fatal(err)
	}
	// A cell whose first frame is long; the reader stops 1000 bytes in.
	if err := raw.send(kernelRequest{Op: "run", ID: 1, MaxBytes: 1 << 20,
		Code: "import sys\nsys.stdout.write('z' * 60000)\nsys.stdout.flush()\nv = 5\nprint('after')"}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 5+1000)); err != nil {
		t.Fatal(err)
	}

	kp := newKernelProcAt(p, newToken()[len("__sandgate_"):])
	t.Cleanup(kp.kill)
	kp.stale = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if end, _ := kp.sync(ctx, 2, 20*time.Second, nil, nil); end != syncDone {
		t.Fatalf("sync of an interpreter taken back inside a frame: %d, want syncDone", end)
	}
	if err := kp.send(kernelRequest{Op: "run", ID: 3, Code: "print('own')\nv", MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	var out, result string
	for f := range kp.frames {
		switch f.kind {
		case 'O':
			out += string(f.data)
		case 'R':
			result = string(f.data)
		case 'J':
			var msg kernelMessage
			if json.Unmarshal(f.data, &msg) != nil || msg.Op != "done" || msg.ID != 3 {
				t.Fatalf("frame %s", f.data)
			}
			if out != "own\n" || result != "5" {
				t.Fatalf("the next cell: stdout %q, result %q", out, result)
			}
			return
		}
	}
	t.Fatal("the channel ended before the next cell's end")
}

func mustWorkdir(t *testing.T) sandbox.Driver {
	t.Helper()
	d, err := workdir.New(workdir.Config{Root: filepath.Join(t.TempDir(), "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
