package compat_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/rest"
)

// sbsIssue is one entry of FastAPI's 422 detail.
type sbsIssue struct {
	Type string `json:"type"`
	Loc  []any  `json:"loc"`
	Msg  string `json:"msg"`
}

type sbsStepOut struct {
	Output   *string `json:"output"`
	Error    *string `json:"error"`
	ExitCode *int    `json:"exit_code"`
}

func TestCompatSBS(t *testing.T) {
	g := filesGateway(t, 0, rest.DataPlane{StepTimeout: time.Second})
	call := func(method, path, body string) compatResp {
		t.Helper()
		return compatCall(t, g, method, "/compat/sbs"+path, aliceKey, body)
	}

	var created struct {
		SessionID string `json:"session_id"`
	}
	for _, body := range []string{"", "{}"} {
		r := call(http.MethodPost, "/sessions", body)
		if r.status != http.StatusOK {
			t.Fatalf("create with body %q: %d %s", body, r.status, r.body)
		}
		r.decode(t, &created)
		if created.SessionID == "" {
			t.Fatalf("create: %s", r.body)
		}
	}
	id := created.SessionID
	// The session is a native one, of the caller's.
	if r := g.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil); r.status != http.StatusOK {
		t.Fatalf("native GET: %d %s", r.status, r.body)
	}
	stepPath := "/sessions/" + id + "/step"
	step := func(typ, key, src string) sbsStepOut {
		t.Helper()
		r := call(http.MethodPost, stepPath, fmt.Sprintf(`{"sandbox_id":%q,"type":%q,"payload":{%q:%q}}`, id, typ, key, src))
		if r.status != http.StatusOK {
			t.Fatalf("step %s %q: %d %s", typ, src, r.status, r.body)
		}
		var out sbsStepOut
		r.decode(t, &out)
		if out.Output == nil || out.Error == nil || out.ExitCode == nil {
			t.Fatalf("step answer misses a field: %s", r.body)
		}
		return out
	}

	t.Run("steps", func(t *testing.T) {
		for _, tc := range []struct {
			name, typ, key, src string
			output, errPrefix   string
			exit                int
		}{
			{"bash stdout", "bash", "cmd", "echo hello", "hello\n", "", 0},
			{"bash stderr and exit code", "bash", "cmd", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3},
			{"bash is a fresh process", "bash", "cmd", "cd /; X=1; echo ${Y:-unset}", "unset\n", "", 0},
			{"python", "python", "code", "print(123)", "123\n", "", 0},
			{"python error", "python", "code", "import sys; sys.exit('boom')", "", "boom\n", 1},
			{"signal", "bash", "cmd", "kill -KILL $$", "", "", -9},
			{"timeout", "bash", "cmd", "echo started; sleep 30", "started\n", "Step timed out after 1 seconds", 124},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out := step(tc.typ, tc.key, tc.src)
				if *out.Output != tc.output || !strings.HasPrefix(*out.Error, tc.errPrefix) || *out.ExitCode != tc.exit {
					t.Errorf("got output %q error %q exit %d", *out.Output, *out.Error, *out.ExitCode)
				}
			})
		}
		// Steps run in the session's workspace, and files persist
		// between them.
		pwd := strings.TrimSpace(*step("bash", "cmd", "pwd").Output)
		if st, err := os.Stat(pwd); err != nil || !st.IsDir() || !strings.HasSuffix(pwd, id) {
			t.Errorf("pwd %q: %v", pwd, err)
		}
		step("bash", "cmd", "echo kept > f.txt")
		if out := step("python", "code", "print(open('f.txt').read(), end='')"); *out.Output != "kept\n" {
			t.Errorf("file between steps: %q", *out.Output)
		}
	})

	t.Run("validation", func(t *testing.T) {
		for _, tc := range []struct {
			name, body string
			want       []string // type@loc of each issue
		}{
			{"no body", "", []string{"missing@body"}},
			{"not json", "{", []string{"json_invalid@body.1"}},
			{"not an object", "[1]", []string{"model_attributes_type@body"}},
			{"empty object", "{}", []string{"missing@body.sandbox_id", "missing@body.type", "missing@body.payload"}},
			{"no sandbox_id", `{"type":"bash","payload":{"cmd":"true"}}`, []string{"missing@body.sandbox_id"}},
			{"sandbox_id not a string", `{"sandbox_id":1,"type":"bash","payload":{"cmd":"true"}}`, []string{"string_type@body.sandbox_id"}},
			{"sandbox_id of another session", `{"sandbox_id":"other","type":"bash","payload":{"cmd":"true"}}`, []string{"value_error@body.sandbox_id"}},
			{"bad type", fmt.Sprintf(`{"sandbox_id":%q,"type":"ruby","payload":{}}`, id), []string{"literal_error@body.type"}},
			{"payload not an object", fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":"ls"}`, id), []string{"dict_type@body.payload"}},
			{"bash without cmd", fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":{"code":"1"}}`, id), []string{"missing@body.payload.cmd"}},
			{"python without code", fmt.Sprintf(`{"sandbox_id":%q,"type":"python","payload":{"cmd":"1"}}`, id), []string{"missing@body.payload.code"}},
			{"cmd not a string", fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":{"cmd":["ls"]}}`, id), []string{"string_type@body.payload.cmd"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := call(http.MethodPost, stepPath, tc.body)
				var e struct {
					Detail []sbsIssue `json:"detail"`
				}
				r.decode(t, &e)
				var got []string
				for _, is := range e.Detail {
					loc := make([]string, len(is.Loc))
					for i, l := range is.Loc {
						loc[i] = fmt.Sprint(l)
					}
					got = append(got, is.Type+"@"+strings.Join(loc, "."))
					if is.Msg == "" {
						t.Errorf("issue without msg: %s", r.body)
					}
				}
				if r.status != http.StatusUnprocessableEntity || fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("got %d %v (%s), want 422 %v", r.status, got, r.body, tc.want)
				}
			})
		}
		// Unknown fields are ignored, as pydantic does.
		r := call(http.MethodPost, stepPath, fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":{"cmd":"true","x":1},"extra":true}`, id))
		if r.status != http.StatusOK {
			t.Errorf("extra fields: %d %s", r.status, r.body)
		}
	})

	detail := func(t *testing.T, r compatResp, status int, want string) {
		t.Helper()
		var e struct {
			Detail string `json:"detail"`
		}
		r.decode(t, &e)
		if r.status != status || e.Detail != want {
			t.Errorf("got %d %s, want %d %q", r.status, r.body, status, want)
		}
	}

	t.Run("not found", func(t *testing.T) {
		body := fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":{"cmd":"true"}}`, id)
		// Another tenant's session does not exist for bob.
		detail(t, compatCall(t, g, http.MethodPost, "/compat/sbs"+stepPath, bobKey, body), 404, "Session not found")
		detail(t, compatCall(t, g, http.MethodDelete, "/compat/sbs/sessions/"+id, bobKey, ""), 404, "Session not found")
		detail(t, call(http.MethodPost, "/sessions/nope/step", `{"sandbox_id":"nope","type":"bash","payload":{"cmd":"true"}}`), 404, "Session not found")
		detail(t, call(http.MethodGet, "/nothing", ""), 404, "Not Found")
		detail(t, call(http.MethodGet, "/sessions", ""), 405, "Method Not Allowed")
	})

	t.Run("delete", func(t *testing.T) {
		r := call(http.MethodDelete, "/sessions/"+id, "")
		if r.status != http.StatusNoContent || len(r.body) != 0 {
			t.Fatalf("delete: %d %q", r.status, r.body)
		}
		detail(t, call(http.MethodPost, stepPath, fmt.Sprintf(`{"sandbox_id":%q,"type":"bash","payload":{"cmd":"true"}}`, id)), 404, "Session not found")
		detail(t, call(http.MethodDelete, "/sessions/"+id, ""), 404, "Session not found")
		if r := g.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil); r.status != http.StatusGone {
			t.Errorf("native GET after delete: %d, want 410 session_gone", r.status)
		}
	})
}
