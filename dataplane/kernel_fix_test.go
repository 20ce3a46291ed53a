package dataplane_test

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
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

// fakePyplot is a matplotlib.pyplot whose one figure takes savefig a
// minute to draw, or fails to.
const fakePyplot = `import sys, types, time
_m = types.ModuleType('matplotlib.pyplot')
class _F:
    def savefig(self, *a, **k):
        if _m.fail:
            raise RuntimeError('cannot draw')
        time.sleep(60)
_m.fail = False
_m.get_fignums = lambda: [1]
_m.figure = lambda n: _F()
_m.close = lambda *a: None
sys.modules['matplotlib.pyplot'] = _m
`

// TestKernelSlowFigureInterrupted: the cell's figures are drawn while the
// cell runs: a slow savefig is interrupted at the timeout (the kernel and
// its state stay), and a figure that fails to draw is the cell's error.
func TestKernelSlowFigureInterrupted(t *testing.T) {
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	kernelCall(t, k, s, "default", py("x = 1\n"+fakePyplot))
	r := py("y = 2")
	r.Display, r.Timeout = true, time.Second
	res := kernelCall(t, k, s, "default", r)
	if res.StateLost || errName(res) != "KeyboardInterrupt" || !res.TimedOut {
		t.Fatalf("slow figure: error %+v, timedOut %v, stateLost %v", res.Error, res.TimedOut, res.StateLost)
	}
	r = py("_m.fail = True")
	r.Display = true
	if res := kernelCall(t, k, s, "default", r); errName(res) != "RuntimeError" {
		t.Errorf("a failing figure: error %+v", res.Error)
	}
	if after := kernelCall(t, k, s, "default", py("del sys.modules['matplotlib.pyplot']\nx")); resultText(after) != "1" {
		t.Fatalf("x is %s", resultText(after))
	}
}

// TestKernelHooksOnlyForDisplay: a kernel that only plain calls (/v1's)
// used has no display hooks: Python's builtins, no import hook; the first
// call that asks for display installs them. A matplotlib import from
// another thread meanwhile is safe (the hook keeps its place in
// sys.meta_path).
func TestKernelHooksOnlyForDisplay(t *testing.T) {
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	probe := py("import builtins, sys\n(hasattr(builtins, 'display'), any(type(f).__name__ == 'MatplotlibHook' for f in sys.meta_path))")
	if got := resultText(kernelCall(t, k, s, "default", probe)); got != "(False, False)" {
		t.Errorf("a plain kernel: %s", got)
	}
	r := py("1")
	r.Display = true
	kernelCall(t, k, s, "default", r)
	if got := resultText(kernelCall(t, k, s, "default", probe)); got != "(True, True)" {
		t.Errorf("after a display call: %s", got)
	}
	threads := py("import threading, importlib.util, sys\n" +
		"errs = []\n" +
		"def f():\n" +
		"    try:\n" +
		"        for _ in range(200): importlib.util.find_spec('matplotlib')\n" +
		"    except Exception as e: errs.append(repr(e))\n" +
		"ts = [threading.Thread(target=f) for _ in range(4)]\n" +
		"[t.start() for t in ts]; [t.join() for t in ts]\n" +
		"(errs, sum(type(f).__name__ == 'MatplotlibHook' for f in sys.meta_path))")
	threads.Display = true
	if got := resultText(kernelCall(t, k, s, "default", threads)); got != "([], 1)" {
		t.Errorf("concurrent finds: %s", got)
	}
}

// TestKernelDisplayAfterOutput: a display comes after the output the
// cell wrote before it.
func TestKernelDisplayAfterOutput(t *testing.T) {
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	for i := range 3 {
		var out int
		var before []int
		r := py("import os, sys\nos.write(1, b'a' * 300000)\nsys.stdout.write('b' * 300000)\ndisplay(1)\nprint('c' * 1000)\ndisplay(2)")
		r.Display = true
		r.OnOutput = func(stderr bool, data []byte) { out += len(data) }
		r.OnDisplay = func(dataplane.Display) { before = append(before, out) }
		res := kernelCall(t, k, s, "default", r)
		if res.Error != nil || len(before) != 2 || before[0] != 600000 || before[1] != 601001 {
			t.Fatalf("run %d: output before each display %v, want [600000 601001] (error %+v)", i, before, res.Error)
		}
	}
}
