package main

import (
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
)

// readySeccomp is the seccomp part of an authenticated /readyz.
type readySeccomp struct {
	Seccomp struct {
		Enabled *bool    `json:"enabled"`
		Blocked []string `json:"blocked"`
		UserNS  *bool    `json:"userns"`
		Reason  string   `json:"reason"`
	} `json:"seccomp"`
}

func (g *gatewayProc) readySeccomp(t *testing.T) readySeccomp {
	t.Helper()
	var r readySeccomp
	if code := g.api(t, http.MethodGet, "/readyz", nil, &r); code != http.StatusOK {
		t.Fatalf("readyz: %d", code)
	}
	if r.Seccomp.Enabled == nil {
		t.Fatalf("readyz has no seccomp.enabled: %+v", r)
	}
	return r
}

// TestSeccompReadyzWorkdir: the workdir driver has no filter, and /readyz
// and the start-up log say so.
func TestSeccompReadyzWorkdir(t *testing.T) {
	g := startGateway(t)
	r := g.readySeccomp(t)
	if *r.Seccomp.Enabled || !strings.Contains(r.Seccomp.Reason, "workdir driver has no seccomp filter") {
		t.Fatalf("workdir: %+v", r.Seccomp)
	}
	if !strings.Contains(g.stderr.String(), "sandbox_seccomp") {
		t.Errorf("no sandbox_seccomp line in the start-up log:\n%s", g.stderr.String())
	}
}

// TestSeccompLinuxFlag: under the linux driver /readyz and the start-up log
// list the filter, and --sandbox-allow-userns reaches the sandboxes: a
// session's command may then create a user namespace, which it may not
// by default.
func TestSeccompLinuxFlag(t *testing.T) {
	requireLinuxDriver(t)
	for _, allow := range []bool{false, true} {
		args := []string{"--sandbox", "linux"}
		if allow {
			args = append(args, "--sandbox-allow-userns")
		}
		g := startGateway(t, args...)
		r := g.readySeccomp(t)
		if !*r.Seccomp.Enabled || *r.Seccomp.UserNS != allow || !slices.Contains(r.Seccomp.Blocked, "keyctl") ||
			slices.Contains(r.Seccomp.Blocked, "unshare(CLONE_NEWUSER)") == allow {
			t.Fatalf("allow-userns %v: readyz seccomp %+v", allow, r.Seccomp)
		}
		if log := g.stderr.String(); !strings.Contains(log, "msg=sandbox_seccomp filter=on") || !strings.Contains(log, "blocked_syscalls=") {
			t.Errorf("the start-up log does not list the filter:\n%s", log)
		}
		id := g.createSession(t).SessionID
		a := runREST(t, g, id, map[string]any{"command": "grep ^Seccomp: /proc/self/status; unshare -U true && echo userns"})
		want := "Seccomp:\t2\n"
		if allow {
			want += "userns\n"
		}
		if a.out() != want {
			t.Errorf("allow-userns %v: %q, want %q", allow, a.out(), want)
		}
		g.stop(t)
	}
}

// --sandbox-allow-userns is off unless given, by flag or environment.
func TestSandboxAllowUserNSFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want bool
	}{
		{nil, "", false},
		{[]string{"--sandbox-allow-userns"}, "", true},
		{nil, "true", true},
		{[]string{"--sandbox-allow-userns=false"}, "true", false},
	} {
		t.Setenv("SANDGATE_SANDBOX_ALLOW_USERNS", tc.env)
		if tc.env == "" {
			os.Unsetenv("SANDGATE_SANDBOX_ALLOW_USERNS")
		}
		c, err := parseServe(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v with env %q: %v", tc.args, tc.env, err)
		}
		if c.sandbox.allowUserNS != tc.want {
			t.Errorf("%v with env %q: %v, want %v", tc.args, tc.env, c.sandbox.allowUserNS, tc.want)
		}
	}
}
