package main

import (
	"net/http"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
)

// pyAnswer is a Python call's JSON answer.
type pyAnswer struct {
	Stdout *string `json:"stdout"`
	Stderr *string `json:"stderr"`
	Result *string `json:"result"`
	Error  *struct {
		Name, Value, Traceback string
	} `json:"error"`
	TimedOut    bool `json:"timedOut"`
	Interrupted bool `json:"interrupted"`
	Restarted   bool `json:"restarted"`
	StateLost   bool `json:"stateLost"`
}

func (p pyAnswer) result() string {
	if p.Result == nil {
		return "<nil>"
	}
	return *p.Result
}

func (p pyAnswer) errName() string {
	if p.Error == nil {
		return ""
	}
	return p.Error.Name
}

// runPython posts code and decodes its 200 answer.
func runPython(t *testing.T, g *gatewayProc, id string, body map[string]any) pyAnswer {
	t.Helper()
	var a pyAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python", body, &a); code != http.StatusOK {
		t.Fatalf("python %v: status %d", body, code)
	}
	return a
}

// TestRESTPython is a notebook-style conversation over REST with the real
// binary, on both drivers (the host's python3: workdir runs it from the
// host, the linux driver's default root is the host's /usr).
func TestRESTPython(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--sandbox", driver)
			id := g.createSession(t).SessionID
			steps := []struct {
				name, code     string
				timeout        float64
				result, stdout string
				err            string
				timedOut       bool
				interrupted    bool
				restarted      bool
				stateLost      bool
			}{
				{name: "assign", code: "x = 10\nx", result: "10"},
				{name: "update", code: "x += 5\nx", result: "15"},
				{name: "import and define", code: "import json\ndef dump(v):\n    return json.dumps(v, sort_keys=True)\n", result: "<nil>"},
				{name: "use them", code: "print(dump({'x': x, 'a': [1, 2]}))", result: "<nil>", stdout: "{\"a\": [1, 2], \"x\": 15}\n"},
				{name: "subprocess", code: "import subprocess\nsubprocess.run('echo from sh; id -u >/dev/null', shell=True)\nNone", result: "<nil>", stdout: "from sh\n"},
				{name: "write a file", code: "open('notes.txt', 'w').write('kept across resets')", result: "18"},
				{name: "exception", code: "{}['k']", result: "<nil>", err: "KeyError"},
				{name: "timeout interrupts", code: "while True: pass", timeout: 1, result: "<nil>", err: "KeyboardInterrupt", timedOut: true, interrupted: true},
				{name: "state kept", code: "x", result: "15"},
				{name: "timeout restarts", code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", timeout: 1,
					result: "<nil>", err: "KernelRestarted", timedOut: true, restarted: true, stateLost: true},
				{name: "state gone", code: "'x' in dir()", result: "False"},
				{name: "define again", code: "x = 1", result: "<nil>"},
				{name: "crash", code: "import os\nos._exit(3)", result: "<nil>", err: "KernelDied", stateLost: true},
				{name: "restarted after the crash", code: "'x' in dir()", result: "False", restarted: true, stateLost: true},
				{name: "files survive", code: "open('notes.txt').read()", result: "'kept across resets'"},
			}
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					body := map[string]any{"code": st.code}
					if st.timeout > 0 {
						body["timeout"] = st.timeout
					}
					a := runPython(t, g, id, body)
					if a.result() != st.result || a.errName() != st.err || a.TimedOut != st.timedOut || a.Interrupted != st.interrupted ||
						a.Restarted != st.restarted || a.StateLost != st.stateLost {
						t.Errorf("got result %s error %+v timedOut %v interrupted %v restarted %v stateLost %v",
							a.result(), a.Error, a.TimedOut, a.Interrupted, a.Restarted, a.StateLost)
					}
					if st.stdout != "" && (a.Stdout == nil || *a.Stdout != st.stdout) {
						t.Errorf("stdout %v, want %q", a.Stdout, st.stdout)
					}
				})
			}
			t.Run("reset", func(t *testing.T) {
				runPython(t, g, id, map[string]any{"code": "y = 2"})
				var r struct {
					Kernel  string
					Existed bool
				}
				if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python/reset", map[string]any{"kernel": "default"}, &r); code != 200 || !r.Existed {
					t.Fatalf("reset: %d %+v", code, r)
				}
				a := runPython(t, g, id, map[string]any{"code": "('y' in dir(), open('notes.txt').read())"})
				if a.result() != "(False, 'kept across resets')" || a.Restarted || a.StateLost {
					t.Errorf("after reset: %s %+v", a.result(), a)
				}
			})
			t.Run("named kernels", func(t *testing.T) {
				runPython(t, g, id, map[string]any{"code": "z = 'other'", "kernel": "other"})
				if a := runPython(t, g, id, map[string]any{"code": "'z' in dir()"}); a.result() != "False" {
					t.Errorf("default sees other's state: %s", a.result())
				}
				if a := runPython(t, g, id, map[string]any{"code": "z", "kernel": "other"}); a.result() != "'other'" {
					t.Errorf("other: %s", a.result())
				}
			})
			// The gateway's stop (cleanup) checks that no process of the
			// session, kernels included, is left.
		})
	}
}

// TestRESTPythonUnavailable: a session on an image without python3 gets
// 400 python_unavailable (linux driver: images need it).
func TestRESTPythonUnavailable(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	img := imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/workspace"}, imagestest.BusyboxLayer(t))
	ref := reg.Push(t, "tools/nopython:1", img)
	g := startGateway(t, "--sandbox", "linux", "--image-allow", reg.Host+"/tools/*")
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": ref}, &s); code != http.StatusCreated {
		t.Fatalf("create on %s: %d", ref, code)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	for range 2 { // and again: nothing is left half started
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/python", map[string]any{"code": "1"}, &e); code != 400 ||
			e.Error.Code != "python_unavailable" || !strings.Contains(e.Error.Message, "python3") {
			t.Errorf("python on busybox: %d %+v", code, e)
		}
	}
	// The session itself is fine.
	if a := runREST(t, g, s.SessionID, map[string]any{"command": "echo ok"}); a.out() != "ok\n" {
		t.Errorf("command: %+v", a)
	}
}
