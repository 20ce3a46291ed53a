package main

import (
	"bytes"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/kubetest"
	"github.com/sandgate/sandgate/sandbox"
)

// The gateway warns at start, naming the knobs, where its sandboxes at
// their bounds could exhaust the host's file table or terminal pool.
func TestWarnHostPools(t *testing.T) {
	def := sandbox.Nofile{}.WithDefaults()
	for _, tt := range []struct {
		name  string
		pools hostPools
		d     sandboxDemand
		want  []string // substrings of the log, in order; none: no warning
	}{
		{"this host's defaults", hostPools{fileMax: 2466177, ptyMax: 4096, ptyReserve: 1024},
			sandboxDemand{maxSessions: 1000, maxPids: 1024, nofile: def},
			[]string{"host_file_table", "fs.file-max", "--sandbox-nofile-hard", "worst_case_files=4194304000",
				"host_pty_pool", "--max-sessions", "kernel.pty.max", "worst_case_ptys=64000"}},
		{"room for all", hostPools{fileMax: 1 << 40, ptyMax: 1 << 20, ptyReserve: 1024},
			sandboxDemand{maxSessions: 1000, maxPids: 1024, nofile: def}, nil},
		{"files at exactly half", hostPools{fileMax: 2 * 10 * 100 * 4096, ptyMax: 4096, ptyReserve: 1024},
			sandboxDemand{maxSessions: 10, maxPids: 100, nofile: def}, nil},
		{"48 sandboxes take the pty pool", hostPools{fileMax: 1 << 40, ptyMax: 4096, ptyReserve: 1024},
			sandboxDemand{maxSessions: 49, maxPids: 8, nofile: def}, []string{"host_pty_pool", "worst_case_ptys=3136"}},
		{"unknown pools", hostPools{}, sandboxDemand{maxSessions: 1000, maxPids: 1024, nofile: def}, nil},
		{"saturates", hostPools{fileMax: 1 << 62}, sandboxDemand{maxSessions: 1 << 40, maxPids: 1 << 40, nofile: sandbox.Nofile{Soft: 1, Hard: 1 << 63}},
			[]string{"host_file_table", "worst_case_files=9223372036854775807"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			warnHostPools(slog.New(slog.NewTextHandler(&buf, nil)), tt.pools, tt.d)
			out := buf.String()
			if len(tt.want) == 0 {
				if out != "" {
					t.Fatalf("warned: %s", out)
				}
				return
			}
			rest := out
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("log lacks %q (in order):\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
			if !strings.Contains(out, "level=WARN") {
				t.Errorf("not a warning: %s", out)
			}
		})
	}
}

func TestSandboxNofileFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want sandbox.Nofile
		err  string
	}{
		{nil, sandbox.Nofile{Soft: 1024, Hard: 4096}, ""},
		{[]string{"--sandbox-nofile", "2048", "--sandbox-nofile-hard", "8192"}, sandbox.Nofile{Soft: 2048, Hard: 8192}, ""},
		{[]string{"--sandbox-nofile", "8192"}, sandbox.Nofile{}, "--sandbox-nofile-hard at least --sandbox-nofile"},
		{[]string{"--sandbox-nofile", "10"}, sandbox.Nofile{}, "at least 64"},
	} {
		c, err := parseServe(tt.args, io.Discard)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%v: err %v, want %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if c.sandbox.nofile != tt.want {
			t.Errorf("%v: %+v, want %+v", tt.args, c.sandbox.nofile, tt.want)
		}
	}
}

// An egress range that holds an etcd endpoint would let sandboxes reach
// the cluster's state: refused unless forced.
func TestEgressCIDRRefusesEtcd(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, "https://127.0.0.1:6443", []byte("ca"), "token", ""); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		err  string
	}{
		{[]string{"--cluster-etcd", "http://127.0.0.1:2379", "--egress-allow-cidr", "127.0.0.0/8"}, "contains etcd endpoint http://127.0.0.1:2379"},
		{[]string{"--cluster-etcd", "http://10.0.0.9:2379,http://10.1.0.9:2379", "--egress-allow-cidr", "192.168.0.0/16", "--egress-allow-cidr", "10.1.0.0/16"}, "10.1.0.0/16 contains etcd endpoint http://10.1.0.9:2379"},
		{[]string{"--cluster-etcd", "http://localhost:2379", "--egress-allow-cidr", "127.0.0.1/32"}, "contains etcd endpoint http://localhost:2379"},
		{[]string{"--cluster-etcd", "http://127.0.0.1:2379", "--egress-allow-cidr", "127.0.0.0/8", "--force-egress-to-etcd"}, ""},
		{[]string{"--cluster-etcd", "http://127.0.0.1:2379", "--egress-allow-cidr", "10.0.0.0/8"}, ""},
		{[]string{"--egress-allow-cidr", "127.0.0.0/8"}, ""},
		// --cluster-kube's store is the API server.
		{[]string{"--cluster-kube", "--kubeconfig", kubeconfig, "--egress-allow-cidr", "127.0.0.0/8"}, "contains the Kubernetes API server (--cluster-kube's store) https://127.0.0.1:6443"},
		{[]string{"--cluster-kube", "--kubeconfig", kubeconfig, "--egress-allow-cidr", "127.0.0.0/8", "--force-egress-to-etcd"}, ""},
		{[]string{"--cluster-kube", "--kubeconfig", kubeconfig, "--egress-allow-cidr", "10.0.0.0/8"}, ""},
	} {
		_, err := parseServe(tt.args, io.Discard)
		if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%v: %v, want %q", tt.args, err, tt.err)
		}
	}
}
