package cluster_test

import (
	"testing"

	"github.com/sandgate/sandgate/cluster"
	"github.com/sandgate/sandgate/cluster/kvtest"
)

// The store conformance suite against a real etcd member.
func TestEtcdKVConformance(t *testing.T) {
	e := startEtcd1(t)
	kv, err := cluster.OpenEtcd(cluster.EtcdConfig{Endpoints: []string{e.client}})
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	kvtest.Run(t, kv, "/kvtest/")
}
