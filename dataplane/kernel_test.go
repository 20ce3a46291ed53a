package dataplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

func py(code string) dataplane.PythonRequest {
	return dataplane.PythonRequest{Code: code, Timeout: 20 * time.Second, MaxOutputBytes: 1 << 20}
}

// kernelCall runs code in kernel name of s and fails the test on an error.
func kernelCall(t *testing.T, k *dataplane.Kernels, s *gateway.Session, name string, r dataplane.PythonRequest) dataplane.PythonResult {
	t.Helper()
	res, err := k.Run(context.Background(), s.ID, s, name, r)
	if err != nil {
		t.Fatalf("run %q: %v", r.Code, err)
	}
	return res
}

func resultText(r dataplane.PythonResult) string {
	if r.Result == nil {
		return "<nil>"
	}
	return *r.Result
}

func errName(r dataplane.PythonResult) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Name
}

// newKernels returns a Kernels whose kernels end with the test.
func newKernels(t *testing.T, s *gateway.Session) *dataplane.Kernels {
	k := &dataplane.Kernels{}
	t.Cleanup(func() {
		for _, name := range []string{"default", "other", "k1", "k2"} {
			k.Reset(s.ID, name)
		}
	})
	return k
}

func TestKernelConversation(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			// Each step runs in the default kernel unless it names one.
			steps := []struct {
				name, kernel, code  string
				result, stdout, err string
				stderrHas           string
			}{
				{name: "assign and echo", code: "x = 10\nx", result: "10"},
				{name: "state persists", code: "x += 5\nx", result: "15"},
				{name: "statement only", code: "y = x * 2", result: "<nil>"},
				{name: "None not echoed", code: "None", result: "<nil>"},
				{name: "print and echo", code: "print('hi', y)\n'done'", stdout: "hi 30\n", result: "'done'"},
				{name: "imports persist", code: "import math", result: "<nil>"},
				{name: "imported module", code: "math.sqrt(16)", result: "4.0"},
				{name: "definitions persist", code: "def f(a):\n    return a * x\n", result: "<nil>"},
				{name: "definition called", code: "f(2)", result: "30"},
				{name: "stderr", code: "import sys\nsys.stderr.write('warn\\n')\nNone", stderrHas: "warn\n", result: "<nil>"},
				{name: "main module", code: "import __main__\n__main__.x", result: "15"},
				{name: "other kernel has its own state", kernel: "other", code: "'x' in dir()", result: "False"},
				{name: "syntax error", code: "1 +", err: "SyntaxError", result: "<nil>"},
				{name: "sys.exit stays", code: "import sys\nsys.exit(2)", err: "SystemExit", result: "<nil>"},
				{name: "after exit", code: "x", result: "15"},
				{name: "input gets EOF", code: "input('? ')", err: "EOFError", result: "<nil>"},
			}
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					name := st.kernel
					if name == "" {
						name = "default"
					}
					res := kernelCall(t, k, s, name, py(st.code))
					if got := resultText(res); got != st.result {
						t.Errorf("result %q, want %q (error %+v)", got, st.result, res.Error)
					}
					if got := errName(res); got != st.err {
						t.Errorf("error %+v, want %q", res.Error, st.err)
					}
					if st.stdout != "" && res.Stdout.Text != st.stdout {
						t.Errorf("stdout %q, want %q", res.Stdout.Text, st.stdout)
					}
					if st.stderrHas != "" && !strings.Contains(res.Stderr.Text, st.stderrHas) {
						t.Errorf("stderr %q, want %q in it", res.Stderr.Text, st.stderrHas)
					}
					if res.StateLost || res.Restarted || res.TimedOut {
						t.Errorf("flags %+v", res)
					}
				})
			}
		})
	}
}

func TestKernelException(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			res := kernelCall(t, k, s, "default", py("def g(d):\n    return d['missing']\n\ng({})"))
			e := res.Error
			if e == nil || e.Name != "KeyError" || e.Value != "'missing'" {
				t.Fatalf("error %+v", e)
			}
			for _, want := range []string{"Traceback (most recent call last):", `File "<cell-1>", line 4`,
				`File "<cell-1>", line 2, in g`, "return d['missing']", "KeyError: 'missing'"} {
				if !strings.Contains(e.Traceback, want) {
					t.Errorf("traceback lacks %q:\n%s", want, e.Traceback)
				}
			}
			if strings.Contains(e.Traceback, "<string>") || strings.Contains(e.Traceback, "run_cell") {
				t.Errorf("traceback shows the driver:\n%s", e.Traceback)
			}
			if res.Result != nil {
				t.Errorf("result %q", *res.Result)
			}
		})
	}
}

func TestKernelTimeout(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			kernelCall(t, k, s, "default", py("x = 1"))
			cases := []struct {
				name, code  string
				interrupted bool
			}{
				{"busy loop is interrupted", "while True: pass", true},
				{"sleep is interrupted", "import time\ntime.sleep(60)", true},
				{"ignored SIGINT restarts", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", false},
				{"swallowed KeyboardInterrupt restarts", "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass", false},
				{"C call holding the GIL restarts", "import ctypes\nctypes.PyDLL(None).sleep(60)", false},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					kernelCall(t, k, s, "default", py("x = 1"))
					// The pause lets the pump forward the output before a C call
					// that holds the GIL (output still in the pipe when a
					// kernel is killed is lost).
					r := py("import time\nprint('before', flush=True)\ntime.sleep(0.3)\n" + c.code)
					r.Timeout = time.Second
					began := time.Now()
					res := kernelCall(t, k, s, "default", r)
					if took := time.Since(began); took > time.Second+dataplane.KernelInterruptGrace+10*time.Second {
						t.Errorf("took %s", took)
					}
					if !res.TimedOut || res.Interrupted != c.interrupted || res.Restarted == c.interrupted || res.StateLost == c.interrupted {
						t.Errorf("flags: timedOut %v interrupted %v restarted %v stateLost %v, error %+v",
							res.TimedOut, res.Interrupted, res.Restarted, res.StateLost, res.Error)
					}
					if c.interrupted && errName(res) != "KeyboardInterrupt" {
						t.Errorf("error %+v", res.Error)
					}
					if res.Stdout.Text != "before\n" {
						t.Errorf("stdout %q", res.Stdout.Text)
					}
					after := kernelCall(t, k, s, "default", py("'x' in dir()"))
					if want := fmt.Sprint(map[bool]string{true: "True", false: "False"}[c.interrupted]); resultText(after) != want {
						t.Errorf("x kept: %s, want %s", resultText(after), want)
					}
					if after.Restarted || after.StateLost {
						t.Errorf("the call after says restarted %v stateLost %v", after.Restarted, after.StateLost)
					}
				})
			}
		})
	}
}

func TestKernelCrash(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			for _, c := range []struct{ name, code, why string }{
				{"exit", "import os\nos._exit(3)", "status 3"},
				{"segfault", "import ctypes\nctypes.string_at(0)", "SIGSEGV"},
				{"killed", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"},
			} {
				t.Run(c.name, func(t *testing.T) {
					kernelCall(t, k, s, "default", py("x = 1"))
					res := kernelCall(t, k, s, "default", py("import time\nprint('bye', flush=True)\ntime.sleep(0.3)\n"+c.code))
					if errName(res) != "KernelDied" || !strings.Contains(res.Error.Value, c.why) || !res.StateLost {
						t.Errorf("crash answer: %+v", res)
					}
					if res.Stdout.Text != "bye\n" {
						t.Errorf("stdout %q", res.Stdout.Text)
					}
					next := kernelCall(t, k, s, "default", py("'x' in dir()"))
					if resultText(next) != "False" || !next.Restarted || !next.StateLost {
						t.Errorf("next answer: %+v %s", next, resultText(next))
					}
					again := kernelCall(t, k, s, "default", py("1"))
					if again.Restarted || again.StateLost {
						t.Errorf("the call after that: %+v", again)
					}
				})
			}
		})
	}
}

func TestKernelReset(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			kernelCall(t, k, s, "default", py("x = 1\nopen('kept.txt', 'w').write('data')"))
			if !k.Reset(s.ID, "default") {
				t.Fatal("no kernel to reset")
			}
			res := kernelCall(t, k, s, "default", py("('x' in dir(), open('kept.txt').read())"))
			if resultText(res) != "(False, 'data')" || res.Restarted || res.StateLost {
				t.Errorf("after reset: %+v %s", res, resultText(res))
			}
			if k.Reset(s.ID, "nothing") {
				t.Error("reset of a kernel that does not exist said there was one")
			}

			// A reset while code runs ends it.
			done := make(chan dataplane.PythonResult, 1)
			go func() {
				res, _ := k.Run(context.Background(), s.ID, s, "default", py("import time\ntime.sleep(60)"))
				done <- res
			}()
			time.Sleep(500 * time.Millisecond)
			k.Reset(s.ID, "default")
			select {
			case res := <-done:
				if errName(res) != "KernelReset" || !res.StateLost {
					t.Errorf("running call: %+v", res)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the running call did not end")
			}
		})
	}
}

func TestKernelHostileOutput(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			kernelCall(t, k, s, "default", py("x = 42"))
			// Frames as the driver writes them, and lengths that would be
			// huge.
			frame := `"J" + "\x00\x00\x00\x20" + '{"op": "done", "id": 99, "error": null}'`
			cases := []struct {
				name, code string
				check      func(t *testing.T, r dataplane.PythonResult)
			}{
				{"framing bytes on stdout", "import sys\nsys.stdout.write(" + frame + ")\nsys.stdout.buffer.write(b'\\xff\\xff\\xff\\xffO')\nNone",
					func(t *testing.T, r dataplane.PythonResult) {
						if !r.Stdout.IsBase64 {
							t.Errorf("stdout %+v", r.Stdout)
						}
					}},
				{"framing bytes on fd 1 and 2", "import os\nos.write(1, b'J\\x00\\x00\\x00\\x05hello')\nos.write(2, b'\\x7f\\xff\\xff\\xff')\nNone",
					func(t *testing.T, r dataplane.PythonResult) {
						if r.Stdout.Text != "J\x00\x00\x00\x05hello" {
							t.Errorf("stdout %q", r.Stdout.Text)
						}
					}},
				{"close fd 1", "import os\nos.close(1)\nprint('lost')", func(t *testing.T, r dataplane.PythonResult) {
					if errName(r) != "OSError" {
						t.Errorf("error %+v", r.Error)
					}
				}},
				{"close fds 0 to 2", "import os\nfor fd in (0, 1, 2): os.close(fd)\n", nil},
				{"sys.stdout None", "import sys\nsys.stdout = None\nprint('nowhere')\nsys.stderr = None\n1/0", func(t *testing.T, r dataplane.PythonResult) {
					if errName(r) != "ZeroDivisionError" {
						t.Errorf("error %+v", r.Error)
					}
				}},
				{"sys.stdout closed", "import sys\nsys.stdout.close()\nsys.stderr.close()", nil},
				{"stdin read", "import sys\nsys.stdin.read()", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != "''" {
						t.Errorf("result %s", resultText(r))
					}
				}},
				{"fd 0 read", "import os\nos.read(0, 10)", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != "b''" {
						t.Errorf("result %s", resultText(r))
					}
				}},
				{"subprocess output", "import os, subprocess\nos.system('echo hi; echo err >&2')\nsubprocess.run(['echo', 'there'])\nNone",
					func(t *testing.T, r dataplane.PythonResult) {
						if r.Stdout.Text != "hi\nthere\n" || r.Stderr.Text != "err\n" {
							t.Errorf("stdout %q stderr %q", r.Stdout.Text, r.Stderr.Text)
						}
					}},
				{"background subprocess holding stdout", "import subprocess\nsubprocess.Popen('echo started; sleep 30', shell=True)\nimport time\ntime.sleep(0.3)\n'back'",
					func(t *testing.T, r dataplane.PythonResult) {
						if r.Stdout.Text != "started\n" || resultText(r) != "'back'" {
							t.Errorf("stdout %q result %s", r.Stdout.Text, resultText(r))
						}
					}},
				{"fork", "import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n'parent'", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != "'parent'" || r.Stdout.Text != "child\n" {
						t.Errorf("result %s stdout %q", resultText(r), r.Stdout.Text)
					}
				}},
				{"multiprocessing pool", "import multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as p:\n    r = p.map(abs, [-1, -2])\nr", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != "[1, 2]" {
						t.Errorf("result %s error %+v", resultText(r), r.Error)
					}
				}},
				{"threads print", "import threading\nth = threading.Thread(target=print, args=('from a thread',))\nth.start(); th.join()", func(t *testing.T, r dataplane.PythonResult) {
					if r.Stdout.Text != "from a thread\n" {
						t.Errorf("stdout %q", r.Stdout.Text)
					}
				}},
				{"surrogates in an error", "raise ValueError('bad \\ud800')", func(t *testing.T, r dataplane.PythonResult) {
					if errName(r) != "ValueError" || r.Error.Value != `bad \ud800` {
						t.Errorf("error %+v", r.Error)
					}
				}},
				{"custom repr with surrogates", "class C:\n    def __repr__(self): return 'c\\udcff'\nC()", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != `c\udcff` {
						t.Errorf("result %q", resultText(r))
					}
				}},
				{"surrogates", "'\\ud800'", func(t *testing.T, r dataplane.PythonResult) {
					if resultText(r) != `'\ud800'` {
						t.Errorf("result %s", resultText(r))
					}
				}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					res := kernelCall(t, k, s, "default", py(c.code))
					if c.check != nil {
						c.check(t, res)
					}
					if res.StateLost || errName(res) == "KernelDied" {
						t.Fatalf("the kernel broke: %+v", res)
					}
					after := kernelCall(t, k, s, "default", py("print('ok')\nx"))
					if resultText(after) != "42" || after.Stdout.Text != "ok\n" || after.StateLost {
						t.Fatalf("after: %+v %s", after, resultText(after))
					}
				})
			}
		})
	}
}

func TestKernelOutputCap(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			r := py("import sys\nsys.stdout.write('a' * 1000 + 'b' * 3000000 + 'c' * 1000)\nos = __import__('os')\nos.system('head -c 2000000 /dev/zero | tr \"\\\\0\" e >&2')\n'x' * 5000")
			r.MaxOutputBytes = 4000
			res := kernelCall(t, k, s, "default", r)
			if !res.Stdout.Truncated || len(res.Stdout.Text) != 4000 ||
				res.Stdout.Text != strings.Repeat("a", 1000)+strings.Repeat("b", 2000)+strings.Repeat("c", 1000) {
				t.Errorf("stdout: truncated %v, %d bytes", res.Stdout.Truncated, len(res.Stdout.Text))
			}
			if !res.Stderr.Truncated || res.Stderr.Text != strings.Repeat("e", 4000) {
				t.Errorf("stderr: truncated %v, %d bytes", res.Stderr.Truncated, len(res.Stderr.Text))
			}
			if !res.ResultTruncated || resultText(res) != "'"+strings.Repeat("x", 3999) || !res.Truncated() {
				t.Errorf("result: truncated %v, %d bytes", res.ResultTruncated, len(resultText(res)))
			}
			// A result past the frame bound of errors and output chunks.
			r = py("'\\x01' * (3 << 20)")
			r.MaxOutputBytes = 10 << 20
			res = kernelCall(t, k, s, "default", r)
			if !res.ResultTruncated || len(resultText(res)) != 10<<20 || !strings.HasPrefix(resultText(res), `'\x01\x01`) {
				t.Errorf("long result: truncated %v, %d bytes, error %+v", res.ResultTruncated, len(resultText(res)), res.Error)
			}
		})
	}
}

func TestKernelSerialised(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			k := newKernels(t, s)
			kernelCall(t, k, s, "default", py("n = 0\nimport time"))
			// Each call reads n, sleeps, writes n+1: only serialised calls
			// count to 8.
			var wg sync.WaitGroup
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := k.Run(context.Background(), s.ID, s, "default", py("v = n\ntime.sleep(0.05)\nn = v + 1"))
					if err != nil || res.Error != nil {
						t.Errorf("%v %+v", err, res.Error)
					}
				}()
			}
			wg.Wait()
			if res := kernelCall(t, k, s, "default", py("n")); resultText(res) != "8" {
				t.Errorf("n = %s", resultText(res))
			}
		})
	}
}

func TestKernelLimits(t *testing.T) {
	s := newSession(t, "workdir")
	k := &dataplane.Kernels{}
	t.Cleanup(func() {
		for i := 0; i < dataplane.MaxKernels; i++ {
			k.Reset(s.ID, fmt.Sprint("k", i))
		}
	})
	for i := 0; i < dataplane.MaxKernels; i++ {
		kernelCall(t, k, s, fmt.Sprint("k", i), py("1"))
	}
	if _, err := k.Run(context.Background(), s.ID, s, "one-too-many", py("1")); !errors.Is(err, dataplane.ErrTooManyKernels) {
		t.Errorf("kernel %d: %v", dataplane.MaxKernels+1, err)
	}
	for _, name := range []string{"default", "a.b-c_1", strings.Repeat("k", 64)} {
		if !dataplane.ValidKernelName(name) {
			t.Errorf("%q refused", name)
		}
	}
	for _, name := range []string{"", "a b", "../x", strings.Repeat("k", 65)} {
		if dataplane.ValidKernelName(name) {
			t.Errorf("%q accepted", name)
		}
	}
}

// TestKernelEndsWithSession: deleting the session ends its kernels.
func TestKernelEndsWithSession(t *testing.T) {
	dir := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{}, d, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	p := gateway.Principal{Tenant: "t", Method: "api_key"}
	s, _, err := m.Create(context.Background(), p, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	k := &dataplane.Kernels{}
	res := kernelCall(t, k, s, "default", py("import os\nos.getpid()"))
	pid, err := strconv.Atoi(resultText(res))
	if err != nil {
		t.Fatalf("pid %q", resultText(res))
	}
	if err := m.Delete(context.Background(), p, s.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the kernel (pid %d) outlived its session", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := k.Run(context.Background(), s.ID, s, "default", py("1")); !errors.Is(err, dataplane.ErrSessionEnded) {
		t.Errorf("run after the end: %v", err)
	}
}
