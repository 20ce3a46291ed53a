package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// kubeResult is one SGBENCH line of kube's TestKubeBench.
type kubeResult struct {
	Row      string    `json:"row"`
	Samples  []float64 `json:"samples"`
	Commands []float64 `json:"commands"`
	Seconds  float64   `json:"seconds"`
	Many     int       `json:"many"`
	AgentRSS []int64   `json:"agentRSSKiB"`
	APIRSS   []int64   `json:"apiserverRSSKiB"`
}

// rowKube is row 13: sandgate on Kubernetes, through a real API server
// (internal/kubetest: etcd + kube-apiserver built from the module proxy)
// and a node agent running the controller (--kube-controller, workdir
// driver). 13a: a Session's create -> the first REST command answered;
// 13b: a SandboxClaim on a warm pool marked for sandgate, the same;
// 13c (only when asked, --rows 13c; --kube-many): that many Sessions held
// by one agent at once. It runs kube's TestKubeBench (go test), which
// prints the samples.
func (b *bench) rowKube() error {
	r := b.report
	n := 50
	if b.cfg.quick {
		n = 10
	}
	many := 0
	if b.cfg.rows["13c"] {
		many = b.cfg.kubeMany
	}
	conf, _ := json.Marshal(map[string]int{"n": n, "many": many})
	cmd := exec.Command("go", "test", "-count=1", "-v", "-timeout=60m", "-run", "^TestKubeBench$", "./kube/")
	cmd.Dir = b.cfg.repo
	cmd.Env = append(os.Environ(), "SANDGATE_BIN="+b.cfg.sandgateBin, "SANDGATE_KUBE_BENCH="+string(conf))
	out, err := cmd.CombinedOutput()
	var got []kubeResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if j, ok := strings.CutPrefix(sc.Text(), "SGBENCH "); ok {
			var k kubeResult
			if json.Unmarshal([]byte(j), &k) == nil {
				got = append(got, k)
			}
		}
	}
	if len(got) == 0 {
		why := "TestKubeBench printed no results"
		if bytes.Contains(out, []byte("--- SKIP")) {
			why = "skipped: " + lastLines(string(out), 3)
		} else if err != nil {
			why = fmt.Sprintf("go test: %v: %s", err, lastLines(string(out), 5))
		}
		r.add(&Row{ID: "13a", Name: "Session create → first command (Kubernetes)", Skipped: why})
		return nil
	}
	names := map[string]string{
		"13a": "Session create → first REST command, through the API server (kube-apiserver, controller, warm pool 4)",
		"13b": "SandboxClaim (warm pool marked sandgate) → first REST command, through the API server",
	}
	for _, k := range got {
		st := NewStats(k.Samples)
		switch k.Row {
		case "13a", "13b":
			r.add(&Row{ID: k.Row, Name: names[k.Row], Stat: "p50", Unit: "s", SG: st, Note: "target p50 <= 50 ms"})
		case "13c":
			note := fmt.Sprintf("%d Sessions held by one agent, all Running in %.1f s (16 clients); agent RSS %d -> %d MiB, kube-apiserver RSS %d -> %d MiB; first command on 1 in 20 with all held: p50 %.1f ms",
				k.Many, k.Seconds, at(k.AgentRSS, 0)>>10, at(k.AgentRSS, 1)>>10, at(k.APIRSS, 0)>>10, at(k.APIRSS, 1)>>10, NewStats(k.Commands).Median*1000)
			r.add(&Row{ID: "13c", Name: fmt.Sprintf("%d Sessions per node agent: each create → Running", k.Many), Stat: "p50", Unit: "s", SG: st, Note: note})
			r.add(&Row{ID: "13c", Name: fmt.Sprintf("%d Sessions per node agent: each create → Running", k.Many), Stat: "p99", Unit: "s", SG: st})
		}
	}
	if err != nil {
		return fmt.Errorf("row 13: go test: %v: %s", err, lastLines(string(out), 10))
	}
	return nil
}

func at(xs []int64, i int) int64 {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " | ")
}
