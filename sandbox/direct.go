package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Direct exec: a REST command that is a plain list of words (or an argv;
// with or without a cwd) runs without the shell, as `bash -c` would run it, with nothing the command or its
// user can tell apart: bash -c execs the last simple command of its
// string in place of itself (no fork; bash 5.1 and later), so the only
// difference is the ~1 ms bash spends starting. The gateway marks the
// commands that may run so (Cmd.Direct, from DirectWords: the text
// alone decides), the sandbox decides with its own root and the
// command's environment (DirectExec: the PATH lookup, what bash would do
// to the environment) and falls back to the shell whenever bash could do
// anything else: a builtin, a name not found or not executable (bash's
// message and 127 or 126), a variable bash reads or sets at startup, a
// directory behind a symbolic link, an exec that fails (ENOEXEC: bash
// runs a script without #! itself). SSH exec always runs the shell, as
// OpenSSH does.

//go:generate ./gen_bashwords.sh

// directMaxEnv bounds the environment DirectExec replicates: bash's
// variable table (1024 buckets) grows, and reorders, past 2048 entries.
const directMaxEnv = 512

// directMaxExec bounds the size of the shell's exec (its argv and
// environment, strings and pointers) below which DirectExec may run a
// command without it: the kernel takes at least 128 KiB (ARG_MAX; one
// string at most MAX_ARG_STRLEN, also 128 KiB) from any exec, so below
// it the shell's exec cannot fail with E2BIG. Above, the shell's may
// fail where the words' alone would not: the shell runs it, and fails as
// it would.
const directMaxExec = 120 << 10

// DirectWords returns the words of command when bash would split it into
// exactly those words and run the first as a program found on PATH (or
// named by a path): only letters, digits and _ . / , : @ % + - = between
// blanks (no quoting, expansion, glob, redirection, list or comment
// character), a first word that is no builtin or keyword of bash, no
// assignment and no job spec.
func DirectWords(command string) ([]string, bool) {
	words := plainWords(command)
	if len(words) == 0 {
		return nil, false
	}
	first := words[0]
	if bashWords[first] || strings.ContainsAny(first, "=%") || first[0] == '-' {
		return nil, false
	}
	return words, true
}

// plainWords returns command's words when bash would split it into
// exactly those (DirectWords' characters only), else nil.
func plainWords(command string) []string {
	for i := 0; i < len(command); i++ {
		c := command[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("_./,:@%+-= \t", c) >= 0) {
			return nil
		}
	}
	return strings.FieldsFunc(command, func(r rune) bool { return r == ' ' || r == '\t' })
}

// directBuiltins are the builtins of bash that do nothing but exit, with
// this status, whatever their arguments: they take no option (bash 5.2
// answers `true --help` with 0 and nothing written), read nothing and
// write nothing.
var directBuiltins = map[string]int{"true": 0, ":": 0, "false": 1}

// DirectBuiltinWords returns the words of command when bash would split
// it into exactly those words (DirectWords' characters only) and run the
// first as one of its builtins that do nothing but exit (true, : and
// false): DirectBuiltin may then answer for it.
func DirectBuiltinWords(command string) ([]string, bool) {
	words := plainWords(command)
	if len(words) == 0 {
		return nil, false
	}
	if _, ok := directBuiltins[words[0]]; !ok {
		return nil, false
	}
	return words, true
}

// DirectBuiltin is how `bash -c` would end s's words (DirectBuiltinWords)
// as the last line of the gateway's script: with code, in directory pwd,
// having written nothing, read nothing and started nothing, which is
// what running nothing does too. ok is false when bash could do anything
// else on the way there: what DirectExec refuses of the environment and
// of the directories, a shell the user may not run, a directory the user
// may not enter (checked by the mode bits, without supplementary groups,
// and refused when an ACL could say otherwise); the caller then runs the
// shell. What no process at all leaves out, and which the caller must
// accept as no difference: the pid the shell would take, the CPU time
// and memory charged to the sandbox's cgroups, and a start that fails
// only because those are at their limits. It looks at the filesystem of
// the caller's root.
func DirectBuiltin(s DirectSpec) (code int, pwd string, ok bool) {
	if s.ExecBuiltin || len(s.Words) == 0 || len(s.ShellArgv) == 0 {
		return 0, "", false
	}
	if code, ok = directBuiltins[s.Words[0]]; !ok {
		return 0, "", false
	}
	st, ok := directStartup(s)
	if !ok {
		return 0, "", false
	}
	shell := s.ShellArgv[0]
	look := searcher{uid: s.UID, gid: s.GID, ok: map[string]bool{}}
	if !look.lookup(shell, false) || !executable(shell, s.UID, s.GID) || hasACL(shell) ||
		!look.lookup(s.Dir, true) || !look.lookup(st.dir, true) {
		return 0, "", false
	}
	return code, st.pwd, true
}

// DirectShell reports whether shell is a bash that execs a -c string's
// last command in place of itself (5.1 or later), which DirectExec
// replicates: it reads the version bash carries in its binary.
func DirectShell(shell string) bool {
	if filepath.Base(shell) != "bash" {
		return false
	}
	// Never blocks: a regular file only (not a FIFO put in its place).
	f, err := os.OpenFile(shell, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() > 64<<20 {
		return false
	}
	const mark = "@(#)Bash version "
	// One buffer, read into after what the last read left that may be the
	// start of the mark (or the mark and part of the version): the binary
	// is read once, without a copy of each read (bash 5.2 carries the mark
	// 1 MB in, which a new init reads before its first command).
	buf := make([]byte, 64<<10)
	keep := 0
	for {
		n, err := f.Read(buf[keep:])
		b := buf[:keep+n]
		if i := bytes.Index(b, []byte(mark)); i >= 0 {
			rest := b[i+len(mark):]
			if len(rest) < 8 && err == nil {
				keep = copy(buf, b[i:])
				continue
			}
			return bashVersionOK(string(rest[:min(len(rest), 8)]))
		}
		if err != nil {
			return false
		}
		keep = copy(buf, b[max(len(b)-(len(mark)-1), 0):])
	}
}

// bashVersionOK reports whether v ("5.2.15...") is bash 5.1 or later:
// the versions whose startup DirectExec replicates.
func bashVersionOK(v string) bool {
	major, rest, _ := strings.Cut(v, ".")
	mj, err := strconv.Atoi(major)
	if err != nil {
		return false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	mn, err := strconv.Atoi(rest[:end])
	if err != nil {
		return false
	}
	return mj == 5 && mn >= 1
}

// DirectArgvOK reports whether argv, run by the shell as `exec 'a' 'b'`
// (its words quoted), may run without it (DirectExec with execBuiltin):
// a program name bash's exec builtin would not take for an option, no NUL.
func DirectArgvOK(argv []string) bool {
	if len(argv) == 0 || argv[0] == "" || argv[0][0] == '-' {
		return false
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return false
		}
	}
	return true
}

// DirectSpec is a command for DirectExec.
type DirectSpec struct {
	// Words are DirectWords' or, with ExecBuiltin, an argv that the shell
	// runs as `exec 'a' 'b'` (DirectArgvOK).
	Words       []string
	ExecBuiltin bool
	// Env is the shell's environment, Dir where it starts.
	Env []string
	Dir string
	// Cwd, when set, is where the script's `cd --` goes before the
	// command: absolute, or relative to $HOME (dataplane's cdScript).
	Cwd string
	// UID and GID are the user's (no supplementary groups).
	UID, GID int
	// ShellArgv is the argv the shell would run with (its path, -c, the
	// script): a shell exec too big for the kernel stays the shell's.
	ShellArgv []string
}

// DirectExec is how `bash -c` would run s's words as the last line of a
// script whose lines before it run builtins only (the gateway's, which
// may cd and then prints $PWD): the program's path, the environment bash
// would give it, in bash's order, and the directory it runs in, which is
// bash's $PWD. ExecBuiltin's exec gives no _. ok is false when bash
// could do anything else than exec that program with that environment:
// the caller then runs the shell. It looks at the filesystem of the
// caller's root.
func DirectExec(s DirectSpec) (path string, execEnv []string, pwd string, ok bool) {
	words := s.Words
	// A builtin's name is bash's to run (the program of that name on
	// PATH may well differ: /usr/bin/true --help), but with the exec
	// builtin, which runs programs only.
	if len(words) == 0 || !s.ExecBuiltin && bashWords[words[0]] {
		return "", nil, "", false
	}
	st, ok := directStartup(s)
	if !ok {
		return "", nil, "", false
	}
	vals, names, oldpwd, dir := st.vals, st.names, st.oldpwd, st.dir
	pwd = st.pwd
	pathVar, set := vals["PATH"]
	if !set {
		return "", nil, "", false
	}
	path, ok = directLookup(words[0], pathVar, dir, s.UID, s.GID)
	if !ok {
		return "", nil, "", false
	}

	// The variables bash exports: the imported ones, then those it
	// creates (PWD, SHLVL), in the order of its variable table: bucket
	// by bucket (FNV-1 of the name, 1024 buckets), the latest inserted
	// first within a bucket. _ is not among them: the gateway's script
	// runs a builtin (printf) before the command, which takes an imported
	// _ out of its place; bash then adds _ (the program's path) last, or,
	// for its exec builtin, not at all.
	type entry struct {
		name string
		seq  int
	}
	entries := make([]entry, 0, len(names)+2)
	for i, k := range names {
		if k != "_" {
			entries = append(entries, entry{k, i})
		}
	}
	if _, set := vals["SHLVL"]; !set {
		vals["SHLVL"] = "0"
		entries = append(entries, entry{"SHLVL", len(entries)})
	}
	if _, set := vals["PWD"]; !set {
		entries = append(entries, entry{"PWD", len(entries)})
	}
	vals["PWD"] = pwd
	if oldpwd != "" {
		vals["OLDPWD"] = oldpwd
		entries = append(entries, entry{"OLDPWD", len(entries)})
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		ha, hb := bashHash(a.name)&1023, bashHash(b.name)&1023
		if ha != hb {
			return int(ha) - int(hb)
		}
		return b.seq - a.seq
	})
	execEnv = make([]string, 0, len(entries)+1)
	for _, e := range entries {
		execEnv = append(execEnv, e.name+"="+vals[e.name])
	}
	if !s.ExecBuiltin {
		execEnv = append(execEnv, "_="+path)
	}
	return path, execEnv, pwd, true
}

// directState is what bash's startup, and the gateway's script before
// the command (its cd), leave: the environment's values and names (in
// their order), the directories ($PWD, $OLDPWD when the script cds, and
// where the command runs).
type directState struct {
	vals        map[string]string
	names       []string
	pwd, oldpwd string
	dir         string
}

// directStartup checks that bash -c would start with s's environment
// and reach s's command as DirectExec and DirectBuiltin assume (nothing
// read, printed or refused on the way), and returns what it would hold
// then. It looks at the filesystem of the caller's root.
func directStartup(s DirectSpec) (directState, bool) {
	env, dir := s.Env, s.Dir
	if len(env) > directMaxEnv || !filepath.IsAbs(dir) || execSize(s.ShellArgv, env) > directMaxExec {
		return directState{}, false
	}
	var pwd string
	// $PWD: bash's getcwd(), the physical directory.
	if real, err := filepath.EvalSymlinks(dir); err != nil || real != filepath.Clean(dir) {
		return directState{}, false
	}
	pwd = filepath.Clean(dir)
	vals := map[string]string{}
	names := make([]string, 0, len(env)+3)
	for _, kv := range env {
		k, v, found := strings.Cut(kv, "=")
		if !found || !validName(k) || directRefused(k) {
			return directState{}, false
		}
		// bash calls setlocale(LC_ALL, v) at startup and warns on stderr
		// when the locale is missing: only those that never are.
		if k == "LC_ALL" && v != "" && v != "C" && v != "POSIX" {
			return directState{}, false
		}
		if _, dup := vals[k]; dup {
			return directState{}, false
		}
		vals[k] = v
		names = append(names, k)
	}
	// bash keeps an imported PWD that names its directory as it is.
	if v, set := vals["PWD"]; set && v != pwd {
		return directState{}, false
	}
	// SHLVL: bash adds one at startup and takes it back when it execs
	// the command; a value it would rewrite is left to it.
	if v, set := vals["SHLVL"]; set {
		n, err := strconv.Atoi(v)
		if err != nil || strconv.Itoa(n) != v || n < 0 || n >= 998 {
			return directState{}, false
		}
	}
	// cd -- DIR: bash's PWD becomes DIR (logical: one with no symbolic
	// link, ., .. or // in it is also the physical one), and OLDPWD, so
	// far exported but unset, the directory before.
	oldpwd := ""
	if s.Cwd != "" {
		target := s.Cwd
		if !filepath.IsAbs(target) {
			home := vals["HOME"]
			if !filepath.IsAbs(home) {
				return directState{}, false
			}
			target = home + "/" + target
		}
		if target != filepath.Clean(target) || strings.HasPrefix(target, "//") {
			return directState{}, false
		}
		if real, err := filepath.EvalSymlinks(target); err != nil || real != target {
			return directState{}, false
		}
		if fi, err := statPath(target); err != nil || !fi.IsDir() {
			return directState{}, false
		}
		oldpwd, pwd, dir = pwd, target, target
	}
	return directState{vals: vals, names: names, pwd: pwd, oldpwd: oldpwd, dir: dir}, true
}

// directRefused says whether bash reads or sets variable k at startup
// other than as DirectExec replicates it.
func directRefused(k string) bool {
	switch k {
	case "PATH", "SHELL", "TERM", "HOSTNAME", "HOSTTYPE", "MACHTYPE", "OSTYPE", "PWD", "SHLVL", "_":
		return false // kept as imported (PWD, SHLVL and _ see DirectExec)
	case "ENV", "POSIXLY_CORRECT", "OLDPWD", "CDPATH":
		return true
	case "EXECIGNORE": // the PATH search's; 5.2 ignores it imported, not assigned
		return true
	case "SSH_CLIENT", "SSH2_CLIENT":
		// Debian's bash (SSH_SOURCE_BASHRC) takes a -c shell started with
		// either set, at SHLVL 1, for one run by sshd: it reads
		// /etc/bash.bashrc and ~/.bashrc first, which may print, exit,
		// or define a function of the command's name.
		return true
	}
	return bashVars[k] || strings.HasPrefix(k, "BASH") || strings.HasPrefix(k, "COMP_")
}

// directLookup finds the program bash would exec for name: name itself
// when it holds a slash, else the first executable file of that name in
// PATH's directories. Anything bash would report (not found, not
// executable, a directory) and any PATH it would read otherwise
// (relative or empty elements, ~) is not ok.
func directLookup(name, pathVar, dir string, uid, gid int) (string, bool) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if !executable(p, uid, gid) {
			return "", false
		}
		return name, true
	}
	if pathVar == "" {
		return "", false
	}
	for _, d := range strings.Split(pathVar, ":") {
		if !strings.HasPrefix(d, "/") {
			return "", false
		}
		full := d + "/" + name // bash's make_full_pathname: PATH's element as it is
		if strings.HasSuffix(d, "/") {
			full = d + name
		}
		fi, err := statPath(full)
		if err != nil || fi.IsDir() {
			continue
		}
		if !executable(full, uid, gid) {
			// bash would remember it and go on; keep it simple and let
			// bash decide.
			return "", false
		}
		return full, true
	}
	return "", false
}

// executable reports whether p is a regular file that uid:gid (no
// supplementary groups) may execute by its mode.
func executable(p string, uid, gid int) bool {
	fi, err := statPath(p)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	st, ok := statOwner(fi)
	if !ok {
		return false
	}
	m := fi.Mode().Perm()
	switch {
	case uid == 0:
		return m&0o111 != 0
	case st.uid == uid:
		return m&0o100 != 0
	case st.gid == gid:
		return m&0o010 != 0
	default:
		return m&0o001 != 0
	}
}

// execSize is what an exec of argv with env takes of the kernel's
// ARG_MAX: the strings with their NULs, and a pointer to each.
func execSize(argv, env []string) int {
	n := 8 * (len(argv) + len(env) + 2)
	for _, l := range [][]string{argv, env} {
		for _, a := range l {
			n += len(a) + 1
		}
	}
	return n
}

// validName reports whether k is a shell variable name.
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// bashHash is bash's hash_string (hashlib.c): 32-bit FNV-1.
func bashHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h *= 16777619
		h ^= uint32(s[i])
	}
	return h
}
