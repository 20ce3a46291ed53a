package dataplane_test

import (
	"testing"
	"time"
)

// TestKernelInterruptDuringDisplay: an interrupt that comes while the
// kernel writes a large display frame waits for the frame's end: the
// cell stops on KeyboardInterrupt and the kernel keeps its state (a torn
// frame broke the channel, killing the kernel).
func TestKernelInterruptDuringDisplay(t *testing.T) {
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	kernelCall(t, k, s, "default", py("x = 1\nclass Big:\n    def _repr_html_(self): return '<p>' + 'y' * (256 << 10) + '</p>'"))
	for i := range 5 {
		r := py("while True:\n    display(Big())")
		r.Display, r.MaxOutputBytes, r.Timeout = true, 1<<40, 500*time.Millisecond
		res := kernelCall(t, k, s, "default", r)
		if res.StateLost || errName(res) != "KeyboardInterrupt" || !res.Interrupted {
			t.Fatalf("run %d: error %+v, interrupted %v, stateLost %v", i, res.Error, res.Interrupted, res.StateLost)
		}
		if after := kernelCall(t, k, s, "default", py("x")); resultText(after) != "1" {
			t.Fatalf("run %d: x is %s", i, resultText(after))
		}
	}
}
