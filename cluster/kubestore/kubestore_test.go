package kubestore_test

import (
	"testing"

	"github.com/sandgate/sandgate/cluster/kubestore"
	"github.com/sandgate/sandgate/cluster/kvtest"
	"github.com/sandgate/sandgate/internal/kubetest"
)

// The store conformance suite against a real kube-apiserver, as the
// service account deploy/rbac-store.yaml binds: a rule missing there
// fails it.
func TestConformance(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{})
	s.ApplyRBAC(t, "../../deploy/rbac-store.yaml", "sandgate")
	kv, err := kubestore.Open(s.TokenConfig(s.ServiceAccountToken(t, "sandgate", "sandgate")), "sandgate")
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	kvtest.Run(t, kv, "/kvtest/")
}
