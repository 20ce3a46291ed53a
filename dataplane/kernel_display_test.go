package dataplane_test

import (
	"bytes"
	"encoding/base64"
	"os"
	"os/exec"
	"testing"

	"github.com/sandgate/sandgate/dataplane"
)

// TestKernelDisplays: a call that asks for display gets the MIME bundles
// of the kernel's display hooks (the last value's, display()'s), as they
// come and in its result; one that does not gets none, as before.
func TestKernelDisplays(t *testing.T) {
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	kernelCall(t, k, s, "default", py("class Rich:\n"+
		"    def _repr_html_(self): return '<b>rich</b>'\n"+
		"    def _repr_png_(self): return b'\\x89PNG-ish'\n"+
		"    def __repr__(self): return 'Rich()'\n"))

	var streamed []dataplane.Display
	var out bytes.Buffer
	req := py("print('before')\ndisplay(Rich(), 7)\nRich()")
	req.Display = true
	req.OnDisplay = func(d dataplane.Display) { streamed = append(streamed, d) }
	req.OnOutput = func(stderr bool, data []byte) {
		if !stderr {
			out.Write(data)
		}
	}
	res := kernelCall(t, k, s, "default", req)
	if res.Error != nil {
		t.Fatalf("error: %+v", res.Error)
	}
	if out.String() != "before\n" || res.Stdout.Text != "before\n" {
		t.Errorf("stdout streamed %q, kept %q", out.String(), res.Stdout.Text)
	}
	if len(res.Displays) != 3 || len(streamed) != 3 {
		t.Fatalf("displays %+v, streamed %+v: want 3", res.Displays, streamed)
	}
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG-ish"))
	for i, want := range []struct {
		main       bool
		text, html string
		png        string
	}{{false, "Rich()", "<b>rich</b>", png}, {false, "7", "", ""}, {true, "Rich()", "<b>rich</b>", png}} {
		d := res.Displays[i]
		html, _ := d.Data["text/html"].(string)
		gotPNG, _ := d.Data["image/png"].(string)
		if d.Main != want.main || d.Data["text/plain"] != want.text || html != want.html || gotPNG != want.png {
			t.Errorf("display %d = %+v, want %+v", i, d, want)
		}
	}
	if resultText(res) != "Rich()" {
		t.Errorf("result %q", resultText(res))
	}

	// Without display: no bundles, display() prints the repr.
	plain := kernelCall(t, k, s, "default", py("display(Rich())\nRich()"))
	if len(plain.Displays) != 0 || plain.Stdout.Text != "Rich()\n" || resultText(plain) != "Rich()" {
		t.Errorf("without display: %+v stdout %q", plain.Displays, plain.Stdout.Text)
	}
}

// TestKernelMatplotlibPNG: a figure matplotlib draws comes back as an
// image/png display, at plt.show() (the kernel's inline backend).
func TestKernelMatplotlibPNG(t *testing.T) {
	// The sandbox runs the python3 of its default PATH (sandbox/process.go),
	// not this process's (a pyenv shim, say).
	probe := exec.Command("/bin/sh", "-c", "python3 -c 'import matplotlib'")
	probe.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := probe.Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the host's python3 has no matplotlib in CI (.ci/run installs python3-matplotlib)")
		}
		t.Skip("the host's python3 has no matplotlib (apt-get install python3-matplotlib)")
	}
	s := newSession(t, "workdir")
	k := newKernels(t, s)
	req := py("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint(len(plt.get_fignums()))")
	req.Display = true
	res := kernelCall(t, k, s, "default", req)
	if res.Error != nil {
		t.Fatalf("error: %+v", res.Error)
	}
	if len(res.Displays) != 1 {
		t.Fatalf("displays: %+v", res.Displays)
	}
	b64, _ := res.Displays[0].Data["image/png"].(string)
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("image/png is not a PNG: %v %q", err, b64[:min(len(b64), 40)])
	}
	if res.Stdout.Text != "0\n" { // show() closed the figure it showed
		t.Errorf("figures left open: %q", res.Stdout.Text)
	}
}
