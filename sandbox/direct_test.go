//go:build linux

package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// needBash skips without the sandbox's bash, and fails under CI.
func needBash(t *testing.T) string {
	t.Helper()
	sh := FindShell()
	if filepath.Base(sh) != "bash" || !DirectShell(sh) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no bash 5.1 or later at %s", sh)
		}
		t.Skipf("no bash 5.1 or later at %s", sh)
	}
	return sh
}

// TestBashWords checks the generated table (gen_bashwords.sh) against
// the bash here.
func TestBashWords(t *testing.T) {
	sh := needBash(t)
	out, err := exec.Command(sh, "-c", "compgen -b; compgen -k").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range strings.Fields(string(out)) {
		if !bashWords[w] {
			t.Errorf("bash's builtin or keyword %q is not in bashWords: run go generate ./sandbox/", w)
		}
	}
	cmd := exec.Command(sh, "-c", "compgen -v")
	cmd.Env = []string{}
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range strings.Fields(string(out)) {
		if !bashVars[v] {
			t.Errorf("bash's variable %q is not in bashVars: run go generate ./sandbox/", v)
		}
	}
}

func TestDirectWords(t *testing.T) {
	for cmd, want := range map[string][]string{
		"ls -la /tmp":          {"ls", "-la", "/tmp"},
		"  env\tA=b  ":         {"env", "A=b"},
		"date +%Y-%m-%d":       {"date", "+%Y-%m-%d"},
		"./run.sh a,b:c@d":     {"./run.sh", "a,b:c@d"},
		"true":                 nil, // builtin
		"echo hi":              nil,
		"[ 1 ]":                nil,
		"if":                   nil,
		"A=1 env":              nil,
		"%1":                   nil,
		"-x":                   nil,
		"ls *":                 nil,
		"ls ?":                 nil,
		"ls [a]":               nil,
		"echo $HOME":           nil,
		"ls ~":                 nil,
		"ls a~":                nil,
		"ls 'a'":               nil,
		`ls "a"`:               nil,
		`ls a\ b`:              nil,
		"ls `x`":               nil,
		"ls #c":                nil,
		"ls {a,b}":             nil,
		"ls >x":                nil,
		"ls <x":                nil,
		"ls | cat":             nil,
		"ls;":                  nil,
		"ls &":                 nil,
		"ls\nls":               nil,
		"ls !x":                nil,
		"ls (x)":               nil,
		"":                     nil,
		"   ":                  nil,
		"ls é":                 nil,
		"env\u00a0x":           nil,
		"exec env":             nil,
		"command env":          nil,
		"ls ^x":                nil,
		"sh -c exit":           {"sh", "-c", "exit"},
		"env -u PATH printenv": {"env", "-u", "PATH", "printenv"},
	} {
		got, ok := DirectWords(cmd)
		if ok != (want != nil) || !slices.Equal(got, want) {
			t.Errorf("DirectWords(%q) = %q, %v; want %q", cmd, got, ok, want)
		}
	}
}

// restPrelude is what the gateway's script runs before a REST command
// (dataplane.Run): a builtin that prints a token and $PWD on stderr.
const restPrelude = "printf '%s%s\\n' TOK \"$PWD\" >&2\n"

// cdLine is the gateway's cd before a command with a cwd (dataplane's
// cdScript).
func cdLine(cwd string) string {
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	switch {
	case cwd == "":
		return ""
	case strings.HasPrefix(cwd, "/"):
		return "cd -- " + quote(cwd) + " || exit 1\n"
	default:
		return `cd -- "$HOME"/` + quote(cwd) + " || exit 1\n"
	}
}

// cutPrelude takes restPrelude's line out of the shell's stderr (when
// the shell got that far).
func cutPrelude(t *testing.T, e *bytes.Buffer) {
	t.Helper()
	s := e.String()
	i := strings.Index(s, "TOK/")
	if i < 0 || i > 0 && s[i-1] != '\n' {
		return
	}
	end := strings.IndexByte(s[i:], '\n')
	e.Reset()
	e.WriteString(s[:i] + s[i+end+1:])
}

// run is how a driver runs words: DirectExec's program when it may, the
// shell when it may not or the exec fails; it says which it did.
func runEither(t *testing.T, sh, dir string, env []string, command, cwd string, direct bool) (stdout, stderr string, code int, wasDirect bool) {
	t.Helper()
	var c *exec.Cmd
	if words, ok := DirectWords(command); ok && direct {
		if path, xenv, pwd, ok := DirectExec(DirectSpec{Words: words, Env: env, Dir: dir, Cwd: cwd, UID: os.Getuid(), GID: os.Getgid(),
			ShellArgv: []string{sh, "-c", cdLine(cwd) + restPrelude + command}}); ok {
			c = &exec.Cmd{Path: path, Args: words, Env: xenv, Dir: pwd}
			wasDirect = true
		}
	}
	for {
		if c == nil {
			c = exec.Command(sh, "-c", cdLine(cwd)+restPrelude+command)
			c.Env, c.Dir = env, dir
			wasDirect = false
		}
		var o, e bytes.Buffer
		c.Stdout, c.Stderr = &o, &e
		err := c.Run()
		if !wasDirect {
			cutPrelude(t, &e)
		}
		var xe *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &xe):
			code = xe.ExitCode()
		case wasDirect:
			c = nil // the exec failed: the shell runs it
			continue
		default:
			t.Fatalf("%q: %v", command, err)
		}
		return o.String(), e.String(), code, wasDirect
	}
}

// TestDirectExecLikeBash runs a table of commands both through bash -c
// and directly where DirectExec allows, and compares what the command
// saw and did: output, errors, exit code, environment (in its order),
// directory.
func TestDirectExecLikeBash(t *testing.T) {
	sh := needBash(t)
	dir := t.TempDir()
	dir, _ = filepath.EvalSymlinks(dir)
	if err := os.WriteFile(filepath.Join(dir, "noshebang"), []byte("echo from-bash $0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "script"), []byte("#!/bin/sh\necho script \"$@\" $PWD\nexit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "envscript"), []byte("#!/bin/sh\nexec printenv\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "noexec"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := BaseEnv(dir, sh)
	many := slices.Clone(base)
	for i := range 300 { // bucket collisions in bash's table: its order within one
		many = append(many, fmt.Sprintf("V%d=%d", i, i))
	}
	envs := map[string][]string{
		"base":       base,
		"client":     mergeEnv(base, []string{"FOO=bar", "TERM=xterm", "HOSTNAME=h"}),
		"shlvl":      mergeEnv(base, []string{"SHLVL=3"}),
		"shlvl-odd":  mergeEnv(base, []string{"SHLVL=007"}),
		"underscore": mergeEnv(base, []string{"_=/x"}),
		"pwd":        mergeEnv(base, []string{"PWD=" + dir}),
		"pwd-wrong":  mergeEnv(base, []string{"PWD=/"}),
		"oldpwd":     mergeEnv(base, []string{"OLDPWD=/"}),
		"ifs":        mergeEnv(base, []string{"IFS=:"}),
		"optind":     mergeEnv(base, []string{"OPTIND=3"}),
		"bash-env":   mergeEnv(base, []string{"BASH_ENV=/dev/null"}),
		"shellopts":  mergeEnv(base, []string{"SHELLOPTS=xtrace"}),
		"ps4":        mergeEnv(base, []string{"PS4=++"}),
		"path-slash": mergeEnv(base, []string{"PATH=/usr/bin/:/bin"}),
		"path-dot":   mergeEnv(base, []string{"PATH=.:/usr/bin:/bin"}),
		"path-empty": mergeEnv(base, []string{"PATH="}),
		"lcall-none": mergeEnv(base, []string{"LC_ALL=xx_YY.UTF-8"}), // bash warns: no such locale
		"lcall-c":    mergeEnv(base, []string{"LC_ALL=C"}),
		"execignore": mergeEnv(base, []string{"EXECIGNORE=*/env"}),
		"many":       many,
		"no-path":    {"HOME=" + dir},
	}
	commands := []struct {
		cmd    string
		direct bool // in the base environment
	}{
		{"env", true},
		{"/usr/bin/env", true},
		{"env -0", true},
		{"env A=b", true},
		{"env -u PATH", true},
		{"printenv SHLVL", true},
		{"printenv _", true},
		{"printenv PWD", true},
		{"id -u", true},
		{"ls -a", true},
		{"ls /nonexistent", true},
		{"ls -l noexec", true},
		{"sh -c exit", true},
		{"/bin/true", true},
		{"/bin/false", true},
		{"sleep 0", true},
		{"uname -s", true},
		{"seq 3", true},
		{"expr 1 + 2", true},
		{"expr 1 / 0", true},
		{"date +%Y -d @0", true},
		{"basename /a/b.c .c", true},
		{"cat", true},
		{"wc -c", true},
		{"stat -c %F sub", true},
		{"./script a b", true},
		{"sub/../script", true},
		{"./envscript", true},
		{"sub/../envscript", true},
		{"/proc/self/exe --version", false}, // bash itself for bash, the caller for the caller
		{"/dev/fd/0", false},
		{"./noshebang", false}, // ENOEXEC: bash runs it
		{"./noexec", false},
		{"sub", false},
		{"./sub", false},
		{"nosuchcommand", false},
		{"./nosuch", false},
		{"/nonexistent/x", false},
		{"true", false},
		{"false", false},
		{"pwd", false},
		{"echo a  b", false},
		{"A=1 env", false},
		{"env;", false},
		{"env >/dev/null", false},
		{"exec env", false},
	}
	for name, env := range envs {
		for _, c := range commands {
			o1, e1, x1, _ := runEither(t, sh, dir, env, c.cmd, "", false)
			o2, e2, x2, d := runEither(t, sh, dir, env, c.cmd, "", true)
			if name == "base" && d != c.direct {
				t.Errorf("%s: %q ran directly: %v, want %v", name, c.cmd, d, c.direct)
			}
			if o1 != o2 || e1 != e2 || x1 != x2 {
				t.Errorf("%s: %q (direct %v):\nbash:   %q %q %d\ndirect: %q %q %d", name, c.cmd, d, o1, e1, x1, o2, e2, x2)
			}
		}
	}
	// The environments bash refuses are the shell's.
	for _, name := range []string{"pwd-wrong", "oldpwd", "ifs", "optind", "bash-env", "shellopts", "ps4", "path-dot", "path-empty", "no-path", "shlvl-odd", "lcall-none", "execignore"} {
		if _, _, _, d := runEither(t, sh, dir, envs[name], "env", "", true); d {
			t.Errorf("%s: env ran directly", name)
		}
	}
	for _, name := range []string{"base", "client", "shlvl", "underscore", "pwd", "many", "path-slash", "lcall-c"} {
		if _, _, _, d := runEither(t, sh, dir, envs[name], "env", "", true); !d {
			t.Errorf("%s: env did not run directly", name)
		}
	}
}

// TestDirectExecE2BIG: a command whose shell exec is too big for the
// kernel (here one -c string past MAX_ARG_STRLEN) fails to start through
// the shell; its words alone would start, so they must not run directly.
func TestDirectExecE2BIG(t *testing.T) {
	sh := needBash(t)
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	env := BaseEnv(dir, sh)
	for _, c := range []struct {
		n      int
		direct bool
	}{{1000, true}, {50 << 10, true}, {70 << 10, false}, {200 << 10, false}} {
		command := "/bin/true" + strings.Repeat(" a", c.n)
		words, ok := DirectWords(command)
		if !ok {
			t.Fatalf("DirectWords refused %d words", c.n)
		}
		shellArgv := []string{sh, "-c", restPrelude + command}
		b := exec.Command(sh, "-c", restPrelude+command)
		b.Env, b.Dir = env, dir
		shellErr := b.Run()
		_, _, _, d := DirectExec(DirectSpec{Words: words, Env: env, Dir: dir, UID: os.Getuid(), GID: os.Getgid(), ShellArgv: shellArgv})
		if d != c.direct {
			t.Errorf("%d words: direct %v, want %v (the shell's exec: %v)", c.n, d, c.direct, shellErr)
		}
		if !d && c.n >= 70<<10 && !errors.Is(shellErr, syscall.E2BIG) {
			t.Errorf("%d words: the shell's exec gave %v, want E2BIG", c.n, shellErr)
		}
		if d && shellErr != nil {
			t.Errorf("%d words ran directly, but the shell gave %v", c.n, shellErr)
		}
	}
}

func TestDirectShell(t *testing.T) {
	for v, want := range map[string]bool{"5.2.15": true, "5.1": true, "5.0.17": false, "4.4.20": false, "6.0": false, "x": false} {
		if got := bashVersionOK(v); got != want {
			t.Errorf("bashVersionOK(%q) = %v", v, got)
		}
	}
	if DirectShell("/bin/sh") && filepath.Base("/bin/sh") != "bash" {
		t.Error("DirectShell(/bin/sh)")
	}
}

// TestDirectExecArgvLikeBash compares argv run by bash as `exec 'a' 'b'`
// (a REST command's argv) with DirectExec's execBuiltin.
func TestDirectExecArgvLikeBash(t *testing.T) {
	sh := needBash(t)
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	for _, env := range [][]string{BaseEnv(dir, sh), mergeEnv(BaseEnv(dir, sh), []string{"_=/x", "SHLVL=2"})} {
		for _, c := range []struct {
			argv   []string
			direct bool
		}{
			{[]string{"env"}, true},
			{[]string{"printenv", "_"}, true},
			{[]string{"sh", "-c", `echo "$0" "$1" $HOME; exit 3`, "a b", "*"}, true},
			{[]string{"/usr/bin/env", "-0"}, true},
			{[]string{"true"}, true}, // exec runs the program, never the builtin
			{[]string{"nosuchcommand"}, false},
			{[]string{"-a"}, false},
			{[]string{""}, false},
		} {
			script := restPrelude + "exec"
			for _, a := range c.argv {
				script += " " + quote(a)
			}
			b := exec.Command(sh, "-c", script)
			b.Env, b.Dir = env, dir
			var o1, e1 bytes.Buffer
			b.Stdout, b.Stderr = &o1, &e1
			err1 := b.Run()
			cutPrelude(t, &e1)
			d := false
			var o2, e2 bytes.Buffer
			var err2 error
			if path, xenv, pwd, ok := DirectExec(DirectSpec{Words: c.argv, ExecBuiltin: true, Env: env, Dir: dir, UID: os.Getuid(), GID: os.Getgid()}); ok && DirectArgvOK(c.argv) {
				d = true
				x := &exec.Cmd{Path: path, Args: c.argv, Env: xenv, Dir: pwd, Stdout: &o2, Stderr: &e2}
				err2 = x.Run()
			} else {
				o2, e2, err2 = o1, e1, err1
			}
			if d != c.direct {
				t.Errorf("%q: direct %v, want %v", c.argv, d, c.direct)
			}
			if o1.String() != o2.String() || e1.String() != e2.String() || fmt.Sprint(err1) != fmt.Sprint(err2) {
				t.Errorf("%q:\nbash:   %q %q %v\ndirect: %q %q %v", c.argv, o1.String(), e1.String(), err1, o2.String(), e2.String(), err2)
			}
		}
	}
}

// TestDirectExecCwdLikeBash compares commands with a cwd (the gateway's
// cd before them) run by bash and directly.
func TestDirectExecCwdLikeBash(t *testing.T) {
	sh := needBash(t)
	home, _ := filepath.EvalSymlinks(t.TempDir())
	for _, d := range []string{"sub/deep", "other", "sp ace"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub", filepath.Join(home, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := filepath.Join(home, "other")
	base := BaseEnv(home, sh)
	many := slices.Clone(base)
	for i := range 300 {
		many = append(many, fmt.Sprintf("V%d=%d", i, i))
	}
	for _, env := range [][]string{base, many, mergeEnv(base, []string{"PWD=" + start, "_=/x"})} {
		for _, c := range []struct {
			cwd    string
			direct bool
		}{
			{"sub", true},
			{"sub/deep", true},
			{"sp ace", true},
			{home + "/sub", true},
			{"/", true},
			{"link", false}, // bash keeps the link's name in PWD
			{"sub/", false},
			{"./sub", false},
			{"sub/..", false},
			{"nosuch", false},
			{"file", false},
			{"/nonexistent/../tmp", false},
		} {
			for _, cmd := range []string{"env", "printenv PWD OLDPWD", "ls -a"} {
				o1, e1, x1, _ := runEither(t, sh, start, env, cmd, c.cwd, false)
				o2, e2, x2, d := runEither(t, sh, start, env, cmd, c.cwd, true)
				if d != c.direct {
					t.Errorf("cwd %q %q: direct %v, want %v", c.cwd, cmd, d, c.direct)
				}
				if o1 != o2 || e1 != e2 || x1 != x2 {
					t.Errorf("cwd %q %q (direct %v):\nbash:   %q %q %d\ndirect: %q %q %d", c.cwd, cmd, d, o1, e1, x1, o2, e2, x2)
				}
			}
		}
	}
	// HOME not absolute: bash's "$HOME"/sub is another directory.
	if _, _, _, d := runEither(t, sh, start, mergeEnv(base, []string{"HOME=rel"}), "env", "sub", true); d {
		t.Error("a relative HOME ran directly")
	}
}

// TestDirectBuiltinLikeBash runs true, : and false (with arguments, in
// several environments and directories) through bash -c, as the
// gateway's script does, and checks that wherever DirectBuiltin answers
// for them its answer is bash's: the exit status, the directory, and
// nothing written.
func TestDirectBuiltinLikeBash(t *testing.T) {
	sh := needBash(t)
	dir := t.TempDir()
	dir, _ = filepath.EvalSymlinks(dir)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// Debian's bash reads it for a -c shell that SSH_CLIENT says sshd ran.
	if err := os.WriteFile(filepath.Join(dir, ".bashrc"), []byte("echo bashrc >&2; exit 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := BaseEnv(dir, sh)
	envs := map[string][]string{
		"base":        base,
		"client":      mergeEnv(base, []string{"FOO=bar", "TERM=xterm"}),
		"ssh-client":  mergeEnv(base, []string{"SSH_CLIENT=192.0.2.1 1 2"}),
		"ssh2-client": mergeEnv(base, []string{"SSH2_CLIENT=192.0.2.1 1 2"}),
		"shellopts":   mergeEnv(base, []string{"SHELLOPTS=xtrace"}),
		"ps4":         mergeEnv(base, []string{"PS4=++"}),
		"bash-env":    mergeEnv(base, []string{"BASH_ENV=/dev/null"}),
		"lcall":       mergeEnv(base, []string{"LC_ALL=xx_YY.UTF-8"}),
		"no-path":     {"HOME=" + dir},
		"pwd-wrong":   mergeEnv(base, []string{"PWD=/"}),
	}
	commands := []string{"true", "false", ":", "true --help", "false --help", ": a b", "true -x", "false a=b"}
	for name, env := range envs {
		for _, cwd := range []string{"", "sub", dir + "/sub", "link", "nosuch"} {
			for _, command := range commands {
				words, ok := DirectBuiltinWords(command)
				if !ok {
					t.Fatalf("DirectBuiltinWords(%q) refused", command)
				}
				b := exec.Command(sh, "-c", cdLine(cwd)+restPrelude+command)
				b.Env, b.Dir = env, dir
				var o, e bytes.Buffer
				b.Stdout, b.Stderr = &o, &e
				err := b.Run()
				code := 0
				var xe *exec.ExitError
				if errors.As(err, &xe) {
					code = xe.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				bashPWD := ""
				if s := e.String(); strings.HasPrefix(s, "TOK") {
					bashPWD, _, _ = strings.Cut(s[len("TOK"):], "\n")
				}
				cutPrelude(t, &e)
				c, pwd, d := DirectBuiltin(DirectSpec{Words: words, Env: env, Dir: dir, Cwd: cwd, UID: os.Getuid(), GID: os.Getgid(),
					ShellArgv: []string{sh, "-c", cdLine(cwd) + restPrelude + command}})
				if name == "base" && cwd == "" && !d {
					t.Errorf("%s: %q was not answered directly", name, command)
				}
				if !d {
					continue
				}
				if o.Len() != 0 || e.Len() != 0 || c != code || pwd != bashPWD {
					t.Errorf("%s, cwd %q: %q:\nbash:   %q %q %d in %q\ndirect: %d in %q", name, cwd, command, o.String(), e.String(), code, bashPWD, c, pwd)
				}
			}
		}
	}
	for _, name := range []string{"shellopts", "ps4", "bash-env", "lcall", "pwd-wrong", "ssh-client", "ssh2-client"} {
		if _, _, _, d := DirectExec(DirectSpec{Words: []string{"env"}, Env: envs[name], Dir: dir, UID: os.Getuid(), GID: os.Getgid(),
			ShellArgv: []string{sh, "-c", restPrelude + "env"}}); d {
			t.Errorf("%s: env was run directly", name)
		}
		if _, _, d := DirectBuiltin(DirectSpec{Words: []string{"true"}, Env: envs[name], Dir: dir, UID: os.Getuid(), GID: os.Getgid(),
			ShellArgv: []string{sh, "-c", restPrelude + "true"}}); d {
			t.Errorf("%s: true was answered directly", name)
		}
	}
	// Not builtins that do nothing, or not plain words.
	for _, command := range []string{"echo", "pwd", "true;", "true >x", "/bin/true", "truex", "exec true", "A=1 true", ""} {
		if _, ok := DirectBuiltinWords(command); ok {
			t.Errorf("DirectBuiltinWords(%q) accepted", command)
		}
	}
	// The exec builtin runs programs: an argv is DirectExec's.
	if _, _, d := DirectBuiltin(DirectSpec{Words: []string{"true"}, ExecBuiltin: true, Env: base, Dir: dir, UID: os.Getuid(), GID: os.Getgid(),
		ShellArgv: []string{sh, "-c", "exec 'true'"}}); d {
		t.Error("an argv was answered as a builtin")
	}
	// DirectExec leaves a builtin's name to bash (the program of that
	// name on PATH answers --help differently).
	if _, _, _, d := DirectExec(DirectSpec{Words: []string{"true", "--help"}, Env: base, Dir: dir, UID: os.Getuid(), GID: os.Getgid(),
		ShellArgv: []string{sh, "-c", "true --help"}}); d {
		t.Error("DirectExec ran a builtin's name")
	}
}

// TestDirectBuiltinUserDirs: a directory, or a shell, that the command's
// user may not go through or run is the shell's to fail in.
func TestDirectBuiltinUserDirs(t *testing.T) {
	sh := needBash(t)
	if os.Getuid() != 0 {
		t.Skip("needs root: directories owned by another user")
	}
	dir := t.TempDir()
	dir, _ = filepath.EvalSymlinks(dir)
	closed := filepath.Join(dir, "closed")
	open := filepath.Join(dir, "open")
	for _, d := range []string{closed, open} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} { // TempDir's are 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	noexec := filepath.Join(dir, "bash")
	if err := os.WriteFile(noexec, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	// A shell behind a symbolic link: the directories the link's
	// target goes through count, as the kernel's lookup searches them.
	closedSub := filepath.Join(closed, "sub")
	if err := os.Mkdir(closedSub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{closedSub, open} {
		if err := os.WriteFile(filepath.Join(d, "bash"), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("closed/sub", filepath.Join(dir, "via-closed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("open", filepath.Join(dir, "via-open")); err != nil {
		t.Fatal(err)
	}
	env := BaseEnv(open, sh)
	spec := func(d, cwd, shell string) DirectSpec {
		return DirectSpec{Words: []string{"true"}, Env: env, Dir: d, Cwd: cwd, UID: 1000, GID: 1000, ShellArgv: []string{shell, "-c", "true"}}
	}
	for name, s := range map[string]DirectSpec{
		"open dir":         spec(open, "", sh),
		"shell via a link": spec(open, "", filepath.Join(dir, "via-open", "bash")),
	} {
		if _, _, ok := DirectBuiltin(s); !ok {
			t.Errorf("%s: refused", name)
		}
	}
	for name, s := range map[string]DirectSpec{
		"closed dir":            spec(closed, "", sh),
		"closed cwd":            spec(open, closed, sh),
		"below a closed dir":    spec(closedSub, "", sh),
		"shell not allowed":     spec(open, "", noexec),
		"shell below closed":    spec(open, "", filepath.Join(closedSub, "bash")),
		"shell via closed link": spec(open, "", filepath.Join(dir, "via-closed", "bash")),
	} {
		if _, _, ok := DirectBuiltin(s); ok {
			t.Errorf("%s: answered directly", name)
		}
	}
}

// DirectShell finds bash's version wherever it lies in the binary, the
// mark or the version split across two reads too, and reads the binary
// without a copy per read: bash 5.2 carries it 1 MB in, which every new
// sandbox's init reads (issue 41: 1.2 MB allocated and 0.6 ms per init).
func TestDirectShellReadsOnce(t *testing.T) {
	const mark = "@(#)Bash version "
	dir := t.TempDir()
	for _, c := range []struct {
		at      int
		version string
		want    bool
	}{
		{1 << 20, "5.2.15(1)", true},
		{64<<10 - 5, "5.2.15(1)", true},             // the mark split
		{64<<10 - len(mark) - 3, "5.1.16(1)", true}, // the version split
		{128<<10 - len(mark), "5.0.17(1)", false},
		{3 << 20, "5.2.15", true}, // at the very end
		{-1, "", false},           // none
	} {
		b := bytes.Repeat([]byte("x@(#)Bash"), (3<<20)/9+1)[:3<<20]
		if c.at >= 0 {
			b = append(b[:c.at], append([]byte(mark+c.version), b[c.at:]...)...)
		}
		sh := filepath.Join(dir, "bash")
		if err := os.WriteFile(sh, b, 0o755); err != nil {
			t.Fatal(err)
		}
		if got := DirectShell(sh); got != c.want {
			t.Errorf("version %q at %d: DirectShell = %v, want %v", c.version, c.at, got, c.want)
		}
		if allocs := testing.AllocsPerRun(3, func() { DirectShell(sh) }); allocs > 8 {
			t.Errorf("version at %d: DirectShell made %.0f allocations, want one buffer", c.at, allocs)
		}
	}
}
