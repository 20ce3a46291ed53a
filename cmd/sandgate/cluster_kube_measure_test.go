package main

import (
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// TestClusterStoreCreateLatency measures, when SANDGATE_MEASURE_STORE=1,
// POST /v1/sessions (workdir) on a node of two, on each store: the rows of
// bench/results/cluster-kube.md. It asserts no time.
func TestClusterStoreCreateLatency(t *testing.T) {
	if os.Getenv("SANDGATE_MEASURE_STORE") != "1" {
		t.Skip("a measurement: SANDGATE_MEASURE_STORE=1 runs it")
	}
	measure := func(label string, n []*clusterNode) {
		const reps = 30
		var ds []time.Duration
		for range reps {
			t0 := time.Now()
			s := n[0].createSession(t)
			ds = append(ds, time.Since(t0))
			if code := n[0].api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		load, _ := os.ReadFile("/proc/loadavg")
		t.Logf("%s: create p50 %.1f ms, p90 %.1f ms, min %.1f ms, max %.1f ms (%d creates; load %s)", label,
			ms(ds[reps/2]), ms(ds[reps*9/10]), ms(ds[0]), ms(ds[reps-1]), reps, string(load[:len(load)-1]))
	}
	etcd := startEtcd(t)
	tok := filepath.Join(t.TempDir(), "cluster-token")
	if err := os.WriteFile(tok, []byte("cluster-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	measure("--cluster-etcd (3 etcd members)", []*clusterNode{startNode(t, etcd, tok, "--api-key", "test-token"), startNode(t, etcd, tok, "--api-key", "test-token")})
	measure("--cluster-kube (kube-apiserver on 1 etcd member)", startKubeCluster(t, 2))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
