package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// directAnswer runs a command with its JSON answer and the Server-Timing
// header's exec (direct or shell).
func directAnswer(t *testing.T, g *gatewayProc, id string, body map[string]any) (cmdAnswer, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+g.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a cmdAnswer
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%v: status %d", body, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	how := ""
	if _, d, ok := strings.Cut(resp.Header.Get("Server-Timing"), "exec;desc="); ok {
		how = d
	}
	return a, how
}

// TestRESTDirectExec runs a table of commands on a gateway that runs
// plain commands without the shell (the default) and on one that runs
// every command through it (--command-shell), one session each, and
// compares what the client gets: output, errors, exit code or signal,
// directory; `env` and `printenv` show the environment, in its order.
// It checks which commands skipped the shell (Server-Timing).
func TestRESTDirectExec(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			// SSH_CLIENT and SSH2_CLIENT, which an operator may let clients set.
			allow := []string{"--ssh-env-allow", "SSH_CLIENT", "--ssh-env-allow", "SSH2_CLIENT"}
			direct := startGateway(t, append([]string{"--sandbox", driver, "--server-timing"}, allow...)...)
			shell := startGateway(t, append([]string{"--sandbox", driver, "--server-timing", "--command-shell"}, allow...)...)
			ds, ss := direct.createSession(t).SessionID, shell.createSession(t).SessionID
			for _, g := range []*gatewayProc{direct, shell} {
				id := ds
				if g == shell {
					id = ss
				}
				setup := "mkdir -p sub && printf 'echo from-bash $0\\n' >noshebang && printf '#!/bin/sh\\necho script \"$@\" \"$PWD\"\\nexit 7\\n' >script && chmod +x noshebang script && printf x >noexec && ln -sf /bin/true link && printf 'echo bashrc >&2; exit 3\\n' >.bashrc"
				if a := runREST(t, g, id, map[string]any{"command": setup}); a.code() != 0 {
					t.Fatalf("setup: %+v", a)
				}
			}
			norm := func(s string, g *gatewayProc, id string) string {
				return strings.NewReplacer(g.DataDir, "DATA", id, "SID").Replace(s)
			}
			for _, c := range []struct {
				body   map[string]any
				direct bool
				// builtin: a builtin that does nothing but exit, which the
				// linux driver's init answers for (sandbox.DirectBuiltin)
				builtin bool
			}{
				{map[string]any{"command": "env"}, true, false},
				{map[string]any{"command": "/usr/bin/env"}, true, false},
				{map[string]any{"command": "env -0"}, true, false},
				{map[string]any{"command": "env", "env": map[string]string{"LC_ALL": "C", "TERM": "dumb"}}, true, false},
				{map[string]any{"command": "env A=b printenv A"}, true, false},
				{map[string]any{"command": "printenv SHLVL"}, true, false},
				{map[string]any{"command": "printenv _"}, true, false},
				{map[string]any{"command": "printenv PWD"}, true, false},
				{map[string]any{"command": "printenv OLDPWD"}, true, false},
				{map[string]any{"command": "id -u"}, true, false},
				{map[string]any{"command": "ls -a"}, true, false},
				{map[string]any{"command": "ls /nonexistent"}, true, false},
				{map[string]any{"command": "/bin/true"}, true, false},
				{map[string]any{"command": "/bin/false"}, true, false},
				{map[string]any{"command": "./link"}, true, false},
				{map[string]any{"command": "sh -c exit"}, true, false},
				{map[string]any{"command": "uname -s"}, true, false},
				{map[string]any{"command": "seq 3"}, true, false},
				{map[string]any{"command": "expr 1 + 2"}, true, false},
				{map[string]any{"command": "expr 1 / 0"}, true, false},
				{map[string]any{"command": "date +%Y -d @0"}, true, false},
				{map[string]any{"command": "cat", "stdin": "in put"}, true, false},
				{map[string]any{"command": "wc -c", "stdin": "12345"}, true, false},
				{map[string]any{"command": "stat -c %F sub"}, true, false},
				{map[string]any{"command": "./script a b"}, true, false},
				{map[string]any{"command": "sub/../script"}, true, false},
				{map[string]any{"command": "/bin/kill -9 0"}, true, false},
				{map[string]any{"command": "sleep 5", "timeout": 0.5}, true, false},
				{map[string]any{"command": "timeout -s KILL 0.1 sleep 5"}, true, false},
				// bash itself for bash; before, the init's (the gateway's) binary
				{map[string]any{"command": "/proc/self/exe -c printenv", "stdin": "x"}, false, false},
				{map[string]any{"command": "./noshebang"}, false, false}, // ENOEXEC: bash runs it
				{map[string]any{"command": "./noexec"}, false, false},
				{map[string]any{"command": "sub"}, false, false},
				{map[string]any{"command": "nosuchcommand"}, false, false},
				{map[string]any{"command": "/nonexistent/x"}, false, false},
				{map[string]any{"command": "pwd"}, false, false},
				{map[string]any{"command": "echo a  b"}, false, false},
				{map[string]any{"command": "A=1 env"}, false, false},
				{map[string]any{"command": "env;"}, false, false},
				{map[string]any{"command": "env", "cwd": "sub"}, true, false},
				{map[string]any{"command": "printenv PWD OLDPWD", "cwd": "sub"}, true, false},
				{map[string]any{"command": "ls -a", "cwd": "/"}, true, false},
				{map[string]any{"command": "env", "cwd": "nosuch"}, false, false},
				{map[string]any{"command": "env", "cwd": "sub/.."}, false, false},
				{map[string]any{"command": "env", "env": map[string]string{"LANG": "C"}}, true, false},
				// bash warns on stderr about a locale it cannot set, before
				// the gateway's first line: the warning stays, the line goes
				{map[string]any{"command": "env", "env": map[string]string{"LC_ALL": "xx_YY.UTF-8"}}, false, false},
				{map[string]any{"command": "env", "env": map[string]string{"LC_ALL": "xx_YY.UTF-8"}, "cwd": "sub"}, false, false},
				{map[string]any{"argv": []string{"env"}}, true, false},
				{map[string]any{"argv": []string{"printenv", "_"}}, true, false},
				{map[string]any{"argv": []string{"sh", "-c", `echo "$0" "$1" $HOME; exit 3`, "a b", "*"}}, true, false},
				{map[string]any{"argv": []string{"true"}}, true, false},
				{map[string]any{"argv": []string{"nosuchcommand"}}, false, false},
				{map[string]any{"argv": []string{"-x"}}, false, false},
				{map[string]any{"argv": []string{"env"}, "cwd": "sub"}, true, false},
				{map[string]any{"command": "true"}, false, true},
				{map[string]any{"command": "false"}, false, true},
				{map[string]any{"command": ":"}, false, true},
				{map[string]any{"command": "true --help"}, false, true},
				{map[string]any{"command": "false a b", "stdin": "in put"}, false, true},
				{map[string]any{"command": "true", "cwd": "sub"}, false, true},
				{map[string]any{"command": "false", "cwd": "/"}, false, true},
				{map[string]any{"command": "true", "cwd": "nosuch"}, false, false},
				{map[string]any{"command": "true", "env": map[string]string{"LC_ALL": "xx_YY.UTF-8"}}, false, false},
				{map[string]any{"command": "true;"}, false, false},
				// Debian's bash reads ~/.bashrc for a bash -c that SSH_CLIENT
				// (or SSH2_CLIENT) says sshd ran.
				{map[string]any{"command": "true", "env": map[string]string{"SSH_CLIENT": "192.0.2.1 1 2"}}, false, false},
				{map[string]any{"command": "false", "env": map[string]string{"SSH2_CLIENT": "192.0.2.1 1 2"}}, false, false},
				{map[string]any{"command": "env", "env": map[string]string{"SSH_CLIENT": "192.0.2.1 1 2"}}, false, false},
				{map[string]any{"argv": []string{"true", "--help"}}, true, false}, // exec runs the program
			} {
				a1, how1 := directAnswer(t, direct, ds, c.body)
				a2, how2 := directAnswer(t, shell, ss, c.body)
				if want := map[bool]string{true: "direct", false: "shell"}[c.direct || c.builtin && driver == "linux"]; how1 != want || how2 != "shell" {
					t.Errorf("%v: ran %q and %q with --command-shell; want %q and shell", c.body, how1, how2, want)
				}
				j1, _ := json.Marshal(a1)
				j2, _ := json.Marshal(a2)
				if n1, n2 := norm(string(j1), direct, ds), norm(string(j2), shell, ss); n1 != n2 {
					t.Errorf("%v:\ndirect: %s\nshell:  %s", c.body, n1, n2)
				}
			}
		})
	}
}
