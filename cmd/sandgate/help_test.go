package main

import (
	"regexp"
	"strings"
	"testing"
)

// serve and image follow the command line's conventions: -h and --help
// print the help on stdout and exit 0; serve's help spells every flag
// with two dashes beside its SANDGATE_* twin (and never shows a value
// taken from the environment); a bad flag or argument prints the error,
// with two dashes, then one line pointing at --help, and exits 2.
func TestServeAndImageHelp(t *testing.T) {
	env := append(cleanEnv(), "SANDGATE_METRICS_TOKEN=secret-metrics-canary", "HOME="+t.TempDir())
	flagLine := regexp.MustCompile(`(?m)^  --([a-z0-9-]+)(.*)$`)
	for _, args := range [][]string{{"serve", "-h"}, {"serve", "--help"}} {
		out, errOut, code := runClient(t, env, nil, sandgateBin, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "Usage: sandgate serve") {
			t.Fatalf("%v: exit %d stderr %q stdout %.200q", args, code, errOut, out)
		}
		if regexp.MustCompile(`(?m)^\s+-[a-z]`).MatchString(out) {
			t.Errorf("%v: a flag with one dash:\n%s", args, out)
		}
		flags := flagLine.FindAllStringSubmatch(out, -1)
		if len(flags) < 50 {
			t.Fatalf("%v: %d flags listed", args, len(flags))
		}
		for _, f := range flags {
			if twin := "[$" + envName(f[1]) + "]"; !strings.Contains(f[2], twin) {
				t.Errorf("%v: --%s does not name %s: %q", args, f[1], twin, f[0])
			}
		}
		if strings.Contains(out, "secret-metrics-canary") {
			t.Errorf("%v shows a value from the environment", args)
		}
	}
	for _, args := range [][]string{{"image", "-h"}, {"image", "--help"}, {"image", "help"}, {"image", "pull", "-h"},
		{"image", "ls", "--help"}, {"image", "rm", "-h"}, {"image", "import", "-h"}, {"image", "prune", "-h"}} {
		out, errOut, code := runClient(t, env, nil, sandgateBin, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "Usage: sandgate image") {
			t.Errorf("%v: exit %d stderr %q stdout %q", args, code, errOut, out)
		}
		if regexp.MustCompile(`(?m)^\s+-[a-z]`).MatchString(out) {
			t.Errorf("%v: a flag with one dash:\n%s", args, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--bogus"}, "--bogus"},
		{[]string{"serve", "--max-sessions", "many"}, "--max-sessions"},
		{[]string{"serve", "--listen"}, "--listen"},
		{[]string{"serve", "extra"}, "extra"},
		{[]string{"serve", "--tls-cert", "x"}, "--tls-key"},
		{[]string{"image", "frobnicate"}, "frobnicate"},
		{[]string{"image", "pull", "--bogus", "alpine"}, "--bogus"},
		{[]string{"image", "pull"}, "arguments"},
		{[]string{"image", "import", "dir"}, "--name"},
		{[]string{"image", "ls", "extra"}, "arguments"},
	} {
		out, errOut, code := runClient(t, env, nil, sandgateBin, tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "sandgate "+tc.args[0]) ||
			!strings.Contains(lines[0], tc.want) || !strings.HasSuffix(lines[1], "--help' for usage.") {
			t.Errorf("%v: exit %d stdout %q, want the error naming %q then one --help line, got %q", tc.args, code, out, tc.want, errOut)
		}
		if regexp.MustCompile(`[^-]-[a-z]{3,}`).MatchString(lines[0]) && !strings.Contains(lines[0], "--") {
			t.Errorf("%v: a flag with one dash in %q", tc.args, lines[0])
		}
	}
}
