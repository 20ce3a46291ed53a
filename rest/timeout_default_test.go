package rest_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate/rest"
)

// TestDefaultTimeoutCappedByMax: a command or kernel call sent without a
// timeout gets the default (60 s) only when the gateway's maximum
// (--max-command-timeout) is not lower; otherwise the maximum. Before, it
// ran its full 60 s past a 2 s maximum.
func TestDefaultTimeoutCappedByMax(t *testing.T) {
	g := newGateway(t, gwOptions{dataPlane: rest.DataPlane{MaxTimeout: 2 * time.Second}})
	id := g.create(t, aliceKey, "").SessionID

	t.Run("command", func(t *testing.T) {
		c := decodeCmd(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/commands", aliceKey, []byte(`{"command": "sleep 30; echo finished"}`)))
		if !c.TimedOut || c.ExitCode == nil || *c.ExitCode != 124 || str(c.Stdout) != "" {
			t.Errorf("a command without a timeout under a 2 s maximum: %+v (stdout %q), want timedOut and exit 124", c, str(c.Stdout))
		}
		// A timeout above the maximum is still refused, and one below it honoured.
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/commands", aliceKey, []byte(`{"command": "true", "timeout": 3}`)), 400, "invalid_timeout")
		c = decodeCmd(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/commands", aliceKey, []byte(`{"command": "echo quick", "timeout": 1.5}`)))
		if c.TimedOut || str(c.Stdout) != "quick\n" {
			t.Errorf("a quick command: %+v", c)
		}
	})

	t.Run("python", func(t *testing.T) {
		p := decodePy(t, g.do(t, http.MethodPost, "/v1/sessions/"+id+"/python", aliceKey, []byte(pyCode("import time\ntime.sleep(30)\nprint('finished')"))))
		if !p.TimedOut || str(p.Stdout) != "" {
			t.Errorf("a kernel call without a timeout under a 2 s maximum: %+v (stdout %q), want timedOut", p, str(p.Stdout))
		}
	})
}
