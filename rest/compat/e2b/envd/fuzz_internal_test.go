package envd

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// FuzzStartRequest: any StartRequest a client can send is checked without
// a panic, and what passes has no NUL, stays in its bounds, and runs the
// given command.
func FuzzStartRequest(f *testing.F) {
	stdin := true
	tag := "t"
	seed, _ := proto.Marshal(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"A": "1"}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}, Tag: &tag, Stdin: &stdin,
	})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m process.StartRequest
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		sr, meta, err := startRequest(&m, map[string]string{"BASE": "1"})
		if err != nil {
			return
		}
		if len(sr.Argv) == 0 || sr.Argv[0] != m.GetProcess().GetCmd() || meta == nil {
			t.Fatalf("argv %q for cmd %q", sr.Argv, m.GetProcess().GetCmd())
		}
		n := 0
		for _, a := range sr.Argv {
			n += len(a)
			if strings.IndexByte(a, 0) >= 0 {
				t.Fatalf("NUL in argv %q", a)
			}
		}
		if n > maxArgvBytes || len(sr.Env) > maxEnvVars+1 || len(sr.Name) > maxTagBytes || len(sr.Cwd) > maxCwdBytes {
			t.Fatalf("over a bound: %d argv bytes, %d env, tag %d, cwd %d", n, len(sr.Env), len(sr.Name), len(sr.Cwd))
		}
		for _, e := range sr.Env {
			if strings.IndexByte(e, 0) >= 0 || !strings.Contains(e, "=") || strings.HasPrefix(e, "=") {
				t.Fatalf("bad env %q", e)
			}
		}
		if sr.PTY != nil && (sr.PTY.Window.Cols == 0 || sr.PTY.Window.Rows == 0) {
			t.Fatalf("empty window %v", sr.PTY.Window)
		}
	})
}

// FuzzKeepaliveInterval: any header gives an interval within its bounds.
func FuzzKeepaliveInterval(f *testing.F) {
	for _, s := range []string{"", "50", "0", "1", "999999999999999999999", "-1", "5x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set("Keepalive-Ping-Interval", v)
		if d := keepaliveInterval(h); d < time.Second || d > 5*time.Minute {
			t.Fatalf("%q: %v", v, d)
		}
	})
}
