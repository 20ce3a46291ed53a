package compat

import "testing"

// Issue 39 item 3: inputs as seed 001's users send them, absolute paths
// (its README's example) too, are paths of the workspace.
func TestAgentInputPath(t *testing.T) {
	for in, want := range map[string]string{
		"/path/to/input1.py":  "path/to/input1.py",
		"/path/to/input2.txt": "path/to/input2.txt",
		"data.csv":            "data.csv",
		"./data.csv":          "data.csv",
		"/work/data.csv":      "data.csv",
		"/workspace/a/b.txt":  "a/b.txt",
		`\work\x.txt`:         "x.txt",
		"//etc//passwd":       "etc/passwd",
		"/workspace":          "workspace",
	} {
		if got, err := agentInputPath(in); err != nil || got != want {
			t.Errorf("agentInputPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/", "/..", "/work/../x", "a/../../b", "../x"} {
		if got, err := agentInputPath(in); err == nil {
			t.Errorf("agentInputPath(%q) = %q, want an error", in, got)
		}
	}
}
