package compat_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/rest"
)

// skSession is Sandkasten's session info.
type skSession struct {
	ID           string    `json:"id"`
	Image        string    `json:"image"`
	Status       string    `json:"status"`
	Cwd          string    `json:"cwd"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	LastActivity time.Time `json:"last_activity"`
}

// skExec is Sandkasten's exec answer.
type skExec struct {
	ExitCode   *int    `json:"exit_code"`
	Cwd        *string `json:"cwd"`
	Output     *string `json:"output"`
	Truncated  *bool   `json:"truncated"`
	DurationMs *int64  `json:"duration_ms"`
}

func TestCompatSandkasten(t *testing.T) {
	g := filesGateway(t, 0, rest.DataPlane{MaxFileBytes: 1 << 20})
	call := func(method, path, body string) compatResp {
		t.Helper()
		return compatCall(t, g, method, "/compat/sandkasten/v1"+path, aliceKey, body)
	}
	nativeErr := func(t *testing.T, r compatResp, status int, code string) {
		t.Helper()
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		r.decode(t, &e)
		if r.status != status || e.Error.Code != code {
			t.Errorf("got %d %s, want %d %s", r.status, r.body, status, code)
		}
	}
	create := func(body string) skSession {
		t.Helper()
		r := call(http.MethodPost, "/sessions", body)
		if r.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", body, r.status, r.body)
		}
		var s skSession
		r.decode(t, &s)
		return s
	}

	t.Run("sessions", func(t *testing.T) {
		for _, tc := range []struct {
			body string
			ttl  time.Duration
		}{
			{"", 1800 * time.Second}, // the seed's session_ttl_seconds
			{"{}", 1800 * time.Second},
			{`{"ttl_seconds":120}`, 120 * time.Second},
			{`{"image":"default","ttl_seconds":0}`, 1800 * time.Second},
		} {
			s := create(tc.body)
			if s.ID == "" || s.Status != "running" || s.Image != "default" || s.Cwd != "" ||
				s.ExpiresAt.Sub(s.CreatedAt).Round(time.Second) != tc.ttl || s.LastActivity.IsZero() {
				t.Errorf("create %s: %+v", tc.body, s)
			}
			var got skSession
			call(http.MethodGet, "/sessions/"+s.ID, "").decode(t, &got)
			if got.ID != s.ID || !got.ExpiresAt.Equal(s.ExpiresAt) {
				t.Errorf("get: %+v, created %+v", got, s)
			}
		}
		r := call(http.MethodGet, "/sessions", "")
		var all []skSession
		r.decode(t, &all)
		if r.status != http.StatusOK || len(all) != 4 {
			t.Errorf("list: %d %s", r.status, r.body)
		}
		// bob sees none of alice's.
		bob := compatCall(t, g, http.MethodGet, "/compat/sandkasten/v1/sessions", bobKey, "")
		if bob.status != http.StatusOK || strings.TrimSpace(string(bob.body)) != "[]" {
			t.Errorf("bob's list: %d %s", bob.status, bob.body)
		}
		nativeErr(t, compatCall(t, g, http.MethodGet, "/compat/sandkasten/v1/sessions/"+all[0].ID, bobKey, ""), 404, "not_found")
		for _, tc := range []struct{ body, code string }{
			{`{"ttl_seconds":5}`, "invalid_ttl"},
			{`{"ttl_seconds":"long"}`, "invalid_field"},
			{`{"workspace_id":"w"}`, "unknown_field"},
			{`{"image":"no-such-image:1"}`, ""},
		} {
			r := call(http.MethodPost, "/sessions", tc.body)
			if r.status/100 != 4 || (tc.code != "" && !strings.Contains(string(r.body), `"code":"`+tc.code+`"`)) {
				t.Errorf("create %s: %d %s", tc.body, r.status, r.body)
			}
		}
		for _, s := range all {
			r := call(http.MethodDelete, "/sessions/"+s.ID, "")
			if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"ok":true}` {
				t.Errorf("delete: %d %s", r.status, r.body)
			}
			// Issue 39: a destroyed session is the seed's row with status
			// destroyed (the gateway's tombstone knows it), not a 404.
			var got skSession
			if r := call(http.MethodGet, "/sessions/"+s.ID, ""); r.status != http.StatusOK {
				t.Errorf("get after delete: %d %s", r.status, r.body)
			} else if r.decode(t, &got); got.ID != s.ID || got.Status != "destroyed" || got.Image != s.Image ||
				!got.CreatedAt.Equal(s.CreatedAt) || got.ExpiresAt.IsZero() || got.LastActivity.IsZero() {
				t.Errorf("get after delete: %+v, created %+v", got, s)
			}
			// Destroying it again succeeds, as the seed's destroy does.
			if r := call(http.MethodDelete, "/sessions/"+s.ID, ""); r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"ok":true}` {
				t.Errorf("delete again: %d %s", r.status, r.body)
			}
			// Another tenant still learns nothing of it.
			nativeErr(t, compatCall(t, g, http.MethodGet, "/compat/sandkasten/v1/sessions/"+s.ID, bobKey, ""), 404, "not_found")
		}
		nativeErr(t, call(http.MethodGet, "/sessions/no-such-session", ""), 404, "not_found")
		nativeErr(t, call(http.MethodDelete, "/sessions/no-such-session", ""), 404, "not_found")
	})

	s := create(`{"ttl_seconds":120}`)
	base := "/sessions/" + s.ID
	exec := func(cmd string, timeoutMs int) skExec {
		t.Helper()
		body := fmt.Sprintf(`{"cmd":%q}`, cmd)
		if timeoutMs > 0 {
			body = fmt.Sprintf(`{"cmd":%q,"timeout_ms":%d}`, cmd, timeoutMs)
		}
		r := call(http.MethodPost, base+"/exec", body)
		if r.status != http.StatusOK {
			t.Fatalf("exec %q: %d %s", cmd, r.status, r.body)
		}
		var e skExec
		r.decode(t, &e)
		if e.ExitCode == nil || e.Cwd == nil || e.Output == nil || e.Truncated == nil || e.DurationMs == nil {
			t.Fatalf("exec answer misses a field: %s", r.body)
		}
		return e
	}

	t.Run("exec", func(t *testing.T) {
		first := exec("pwd", 0)
		ws := strings.TrimSpace(*first.Output)
		if *first.ExitCode != 0 || *first.Cwd != ws || !strings.HasSuffix(ws, s.ID) {
			t.Fatalf("pwd: %+v %q", first, *first.Output)
		}
		for _, tc := range []struct {
			name, cmd string
			timeoutMs int
			output    string
			exit      int
			cwdSuffix string
		}{
			{"cd persists", "mkdir -p sub/dir && cd sub/dir && export V=kept", 0, "", 0, "/sub/dir"},
			{"state persists", "echo $V; basename $PWD", 0, "kept\ndir\n", 0, "/sub/dir"},
			{"stderr merged in order", "echo a; echo b >&2; echo c; echo d >&2", 0, "a\nb\nc\nd\n", 0, "/sub/dir"},
			{"exit code", "cd ..; false", 0, "", 1, "/sub"},
			{"timeout", "echo before; sleep 30", 500, "before\n", 124, "/sub"},
			{"state survives the timeout", "echo $V; basename $PWD", 0, "kept\nsub\n", 0, "/sub"},
			{"syntax error", "if then", 0, "", 2, "/sub"},
			{"a huge timeout is the maximum, not wrapped", "echo big", 10000000000000, "big\n", 0, "/sub"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := exec(tc.cmd, tc.timeoutMs)
				if *e.ExitCode != tc.exit || !strings.HasSuffix(*e.Cwd, tc.cwdSuffix) ||
					(tc.output != "" && *e.Output != tc.output) || (tc.exit == 2 && *e.Output == "") {
					t.Errorf("got exit %d cwd %q output %q", *e.ExitCode, *e.Cwd, *e.Output)
				}
			})
		}
		if e := exec("yes | head -c 3000000", 0); !*e.Truncated || len(*e.Output) > 1<<20 {
			t.Errorf("big output: truncated %v, %d bytes", *e.Truncated, len(*e.Output))
		}
		var got skSession
		call(http.MethodGet, base, "").decode(t, &got)
		if !strings.HasSuffix(got.Cwd, "/sub") {
			t.Errorf("session cwd %q", got.Cwd)
		}
		for _, body := range []string{`{}`, `{"cmd":"  "}`, `{"cmd":"true","timeout_ms":-1}`, `{"command":"true"}`, `{"cmd":1}`} {
			if r := call(http.MethodPost, base+"/exec", body); r.status != http.StatusBadRequest {
				t.Errorf("exec %s: %d %s", body, r.status, r.body)
			}
		}
		nativeErr(t, call(http.MethodPost, "/sessions/nope/exec", `{"cmd":"true"}`), 404, "not_found")
	})

	t.Run("fs", func(t *testing.T) {
		write := func(body string) compatResp {
			t.Helper()
			return call(http.MethodPost, base+"/fs/write", body)
		}
		read := func(query string) (string, bool, compatResp) {
			t.Helper()
			r := call(http.MethodGet, base+"/fs/read?"+query, "")
			var out struct {
				ContentBase64 *string `json:"content_base64"`
				Truncated     *bool   `json:"truncated"`
			}
			if r.status != http.StatusOK {
				return "", false, r
			}
			r.decode(t, &out)
			if out.ContentBase64 == nil || out.Truncated == nil {
				t.Fatalf("read answer misses a field: %s", r.body)
			}
			b, err := base64.StdEncoding.DecodeString(*out.ContentBase64)
			if err != nil {
				t.Fatal(err)
			}
			return string(b), *out.Truncated, r
		}
		py := base64.StdEncoding.EncodeToString([]byte("print('hi')\n"))
		for _, body := range []string{
			fmt.Sprintf(`{"path":"/workspace/foo.py","content_base64":%q}`, py),
			`{"path":"notes/a.txt","text":"hello world"}`,
		} {
			if r := write(body); r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"ok":true}` {
				t.Errorf("write %s: %d %s", body, r.status, r.body)
			}
		}
		// /workspace/... is the workspace: the shell sees the files.
		if e := exec("cd && cat foo.py notes/a.txt", 0); *e.Output != "print('hi')\nhello world" {
			t.Errorf("files from the shell: %q", *e.Output)
		}
		for _, tc := range []struct {
			query, content string
			truncated      bool
		}{
			{"path=/workspace/foo.py", "print('hi')\n", false},
			{"path=foo.py&max_bytes=5", "print", true},
			{"path=/workspace/notes/a.txt&max_bytes=11", "hello world", false},
			{"path=notes/a.txt&max_bytes=0", "hello world", false},
		} {
			content, truncated, r := read(tc.query)
			if r.status != http.StatusOK || content != tc.content || truncated != tc.truncated {
				t.Errorf("read %s: %d %q %v %s", tc.query, r.status, content, truncated, r.body)
			}
		}
		for _, tc := range []struct {
			body   string
			status int
			code   string
		}{
			{`{"path":"x","text":"a","content_base64":"YQ=="}`, 400, "invalid_content"},
			{`{"path":"x"}`, 400, "invalid_content"},
			{`{"path":"x","content_base64":"%%%"}`, 400, "invalid_content"},
			{`{"text":"a"}`, 400, "invalid_path"},
			{`{"path":"","text":"a"}`, 400, "invalid_path"},
			{`{"path":"notes","text":"a"}`, 409, "is_a_directory"},
			{`{"path":"x","text":"a","mode":"0600"}`, 400, "unknown_field"},
			{fmt.Sprintf(`{"path":"big","content_base64":%q}`, base64.StdEncoding.EncodeToString(make([]byte, 1<<20+1))), 413, "file_too_large"},
		} {
			nativeErr(t, write(tc.body), tc.status, tc.code)
		}
		for _, tc := range []struct {
			query  string
			status int
			code   string
		}{
			{"path=missing.txt", 404, "file_not_found"},
			{"path=notes", 409, "is_a_directory"},
			{"", 400, "invalid_path"},
			{"path=foo.py&max_bytes=-1", 400, "invalid_parameter"},
			{"path=foo.py&max_bytes=many", 400, "invalid_parameter"},
		} {
			_, _, r := read(tc.query)
			nativeErr(t, r, tc.status, tc.code)
		}
	})

	t.Run("lease", func(t *testing.T) {
		for _, op := range []struct {
			name, method, path, body string
		}{
			{"exec", http.MethodPost, "/exec", `{"cmd":"true"}`},
			{"write", http.MethodPost, "/fs/write", `{"path":"lease.txt","text":"x"}`},
			{"read", http.MethodGet, "/fs/read?path=lease.txt", ""},
		} {
			var before, after skSession
			call(http.MethodGet, base, "").decode(t, &before)
			time.Sleep(1100 * time.Millisecond)
			if r := call(op.method, base+op.path, op.body); r.status != http.StatusOK {
				t.Fatalf("%s: %d %s", op.name, r.status, r.body)
			}
			call(http.MethodGet, base, "").decode(t, &after)
			if d := after.ExpiresAt.Sub(before.ExpiresAt); d < time.Second {
				t.Errorf("%s moved expires_at by %v", op.name, d)
			}
			if d := time.Until(after.ExpiresAt); d < 118*time.Second || d > 120*time.Second {
				t.Errorf("%s: expires in %v, want the ttl of 120s", op.name, d)
			}
		}
	})

	t.Run("after delete", func(t *testing.T) {
		if r := call(http.MethodDelete, base, ""); r.status != http.StatusOK {
			t.Fatalf("delete: %d %s", r.status, r.body)
		}
		// Issue 39: the seed's state, destroyed, not 404.
		nativeErr(t, call(http.MethodPost, base+"/exec", `{"cmd":"true"}`), 410, "session_destroyed")
		nativeErr(t, call(http.MethodPost, base+"/fs/write", `{"path":"a","text":"a"}`), 410, "session_destroyed")
		r := call(http.MethodGet, base+"/fs/read?path=foo.py", "")
		nativeErr(t, r, 410, "session_destroyed")
		var got skSession
		if r := call(http.MethodGet, base, ""); r.status != http.StatusOK {
			t.Errorf("get after delete: %d %s", r.status, r.body)
		} else if r.decode(t, &got); got.Status != "destroyed" {
			t.Errorf("get after delete: %+v", got)
		}
	})
}
