//go:build linux

package linuxns_test

import (
	"context"
	"slices"
	"testing"

	"github.com/sandgate/sandgate/sandbox"
)

// The init gets its spec before the workspace is made, and builds the
// default root and its /etc meanwhile (ctl.Spec.Late): a create then
// costs the longer of the two, not their sum. Its steps say so: /etc is
// built before the init waits for the workspace.
func TestLinuxInitBuildsRootBeforeWorkspace(t *testing.T) {
	dataDir := t.TempDir()
	d := openLinux(t, sandbox.Config{DataDir: dataDir})
	tr := sandbox.NewTrace()
	sb, err := d.Create(sandbox.WithTrace(context.Background(), tr), sandbox.Spec{ID: "sbx-early-spec"})
	if err != nil {
		t.Fatal(err)
	}
	steps, _ := tr.Steps()
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	etc, wait := slices.Index(names, "init.etc"), slices.Index(names, "init.wait_workspace")
	if etc < 0 || wait < 0 || etc > wait || !slices.Contains(names, "init_spec") {
		t.Errorf("create steps %q: want init_spec, then the init's /etc (init.etc) before it waits for the workspace (init.wait_workspace)", names)
	}
	if _, _, e := runIn(t, sb, "test -w /workspace && test -s /etc/hostname"); e.Code != 0 {
		t.Errorf("workspace or /etc missing: exit %+v", e)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, dataDir)
}
