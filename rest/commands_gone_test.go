package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// goneCtx is the request context of a client that goes away while its
// command streams: Done closes when the test says, and what the context
// package derives from it (context.AfterFunc, WithCancel) hears of it only
// once the handler has returned. net/http's own request context can do
// the same: its cancel closes the Done channel before it cancels the
// contexts derived from it, and a handler that sees Done closed may return
// in between.
type goneCtx struct {
	context.Context // values: none
	done            chan struct{}
	// returned is closed once the handler has returned: Err waits for it
	// when Done is closed, and the context package, which reads Err before
	// it cancels a derived context, waits with it.
	returned chan struct{}
}

func (c *goneCtx) Done() <-chan struct{} { return c.done }

func (c *goneCtx) Err() error {
	select {
	case <-c.done:
	default:
		return nil
	}
	select {
	case <-c.returned:
	case <-time.After(10 * time.Second): // no hang should the handler itself ask
	}
	return context.Canceled
}

// lineRecorder is a ResponseWriter that says when the first line is in.
type lineRecorder struct {
	header http.Header
	mu     sync.Mutex
	buf    bytes.Buffer
	line   chan struct{}
	once   sync.Once
}

func (w *lineRecorder) Header() http.Header { return w.header }
func (w *lineRecorder) WriteHeader(int)     {}
func (w *lineRecorder) Flush()              {}

func (w *lineRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if bytes.IndexByte(w.buf.Bytes(), '\n') >= 0 {
		w.once.Do(func() { close(w.line) })
	}
	return len(p), nil
}

// TestStreamedCommandKilledWhenClientGoes: a foreground command whose
// streaming client goes away is killed, even when the request context's
// Done channel closes before the contexts derived from it are cancelled;
// a background one runs on. (The handler used to kill a foreground command
// through a context.AfterFunc on the request context, which its own return
// then stopped before it ran: the command ran on, a rare flake of
// TestRESTCommands under load.)
func TestStreamedCommandKilledWhenClientGoes(t *testing.T) {
	g := newGateway(t, gwOptions{})
	id := g.create(t, aliceKey, "").SessionID

	t.Run("foreground", func(t *testing.T) {
		const command = "echo started; sleep 60; echo not-killed"
		leaveStream(t, g, id, `{"command": "`+command+`"}`)
		if c := waitHistory(t, g, id, command); c.ExitSignal == nil {
			t.Errorf("the command was not killed: exit code %v", c.ExitCode)
		}
	})
	t.Run("background", func(t *testing.T) {
		const command = "echo started; sleep 0.5; echo done"
		leaveStream(t, g, id, `{"command": "`+command+`", "background": true}`)
		if c := waitHistory(t, g, id, command); c.ExitCode == nil || *c.ExitCode != 0 {
			t.Errorf("the background command did not end on its own: %+v", c)
		}
	})
}

// leaveStream posts body for a stream, and goes away (goneCtx) once the
// first line is in.
func leaveStream(t *testing.T, g *testGateway, id, body string) {
	t.Helper()
	gc := &goneCtx{Context: context.Background(), done: make(chan struct{}), returned: make(chan struct{})}
	req, err := http.NewRequestWithContext(gc, http.MethodPost, "/v1/sessions/"+id+"/commands", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("Accept", "application/x-ndjson")
	w := &lineRecorder{header: http.Header{}, line: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.handler.ServeHTTP(w, req)
	}()
	defer close(gc.returned)
	select {
	case <-w.line:
	case <-served:
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("answered before any output: %s", w.buf.String())
	case <-time.After(10 * time.Second):
		t.Fatal("no output")
	}
	close(gc.done) // the client is gone
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not return when its client went")
	}
}

// historyEntry is a command of GET /v1/sessions/{id}/commands.
type historyEntry struct {
	Command    string  `json:"command"`
	ExitCode   *int    `json:"exitCode"`
	ExitSignal *string `json:"exitSignal"`
}

// waitHistory waits (10 s at most) for command to end, and returns its
// entry in the session's history.
func waitHistory(t *testing.T, g *testGateway, id, command string) historyEntry {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := g.do(t, http.MethodGet, "/v1/sessions/"+id+"/commands", aliceKey, nil)
		var h struct {
			Commands []historyEntry `json:"commands"`
		}
		if err := json.Unmarshal(r.body, &h); err != nil {
			t.Fatalf("history %d %s: %v", r.status, r.body, err)
		}
		for _, c := range h.Commands {
			if c.Command == command {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q still runs 10s after its client went: history %s", command, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
