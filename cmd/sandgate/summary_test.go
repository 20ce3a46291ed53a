package main

import (
	"regexp"
	"strings"
	"testing"
)

// The start-up summary is a few short lines of key=value pairs, not Go
// map dumps: the driver and its isolation, the limits, seccomp, egress
// and images, each under 300 characters, in text and JSON logs.
func TestStartupSummary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		linux bool
		args  []string
		want  map[string][]string
	}{
		{"workdir", false, []string{"--sandbox", "workdir"}, map[string][]string{
			"sandbox":         {"driver=workdir", "isolation=none"},
			"sandbox_limits":  {"enforced=none", "unenforced=memory,cpus,pids,disk"},
			"sandbox_seccomp": {"filter=off"},
			"egress":          {"allow=*", "allow_cidr=none"},
			"images":          {"pull=missing", "pull_allowed=none", "store_max="},
		}},
		{"linux", true, []string{"--sandbox", "linux", "--sandbox-memory", "256MiB", "--egress-allow", "*.example.com",
			"--image-allow", "docker.io/library/*"}, map[string][]string{
			"sandbox":         {"driver=linux", "isolation=\"namespaces: user,mount,pid,net"},
			"sandbox_limits":  {"memory=256MiB", "cpus=1", "pids=256", "workspace=1GiB", "enforced_by="},
			"sandbox_seccomp": {"filter=on", "blocked_syscalls=", "user_namespaces=refused"},
			"egress":          {"allow=*.example.com"},
			"images":          {"pull_allowed=docker.io/library/*"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.linux {
				requireLinuxDriver(t)
			}
			g := startGateway(t, tc.args...)
			g.stop(t)
			log := g.stderr.String()
			if strings.Contains(log, "map[") {
				t.Errorf("a map dump in the start-up log:\n%s", log)
			}
			for msg, wants := range tc.want {
				line := regexp.MustCompile(`(?m)^.* msg=` + msg + ` .*$`).FindString(log)
				if line == "" {
					t.Errorf("no %s line in:\n%s", msg, log)
					continue
				}
				if len(line) > 300 {
					t.Errorf("%s line is %d characters: %s", msg, len(line), line)
				}
				for _, w := range wants {
					if !strings.Contains(line, w) {
						t.Errorf("%s line lacks %q: %s", msg, w, line)
					}
				}
			}
		})
	}
}
