package envd_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
)

// eventSet is events by "TYPE name".
func eventSet(evs []*filesystem.FilesystemEvent) map[string]*filesystem.FilesystemEvent {
	m := map[string]*filesystem.FilesystemEvent{}
	for _, ev := range evs {
		m[ev.GetType().String()+" "+ev.GetName()] = ev
	}
	return m
}

func TestWatchDirStream(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{Interval: 50 * time.Millisecond})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	sb.upload(t, "w/old.txt", "old")

	wctx, cancel := context.WithCancel(c)
	defer cancel()
	st, err := sb.fs.WatchDir(wctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "w", Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("first event %v, %v: want start", st.Msg(), st.Err())
	}
	// As files.watch_dir's caller does: write once watching.
	sb.upload(t, "w/new.txt", "new")
	sb.upload(t, "w/sub/deep.txt", "deep")
	if _, err := sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "w/old.txt"})); err != nil {
		t.Fatal(err)
	}
	seen := map[string]*filesystem.FilesystemEvent{}
	for _, want := range []string{"EVENT_TYPE_CREATE new.txt", "EVENT_TYPE_CREATE sub/deep.txt", "EVENT_TYPE_REMOVE old.txt"} {
		for seen[want] == nil {
			if !st.Receive() {
				t.Fatalf("stream ended before %s: %v (seen %v)", want, st.Err(), seen)
			}
			if ev := st.Msg().GetFilesystem(); ev != nil {
				seen[ev.GetType().String()+" "+ev.GetName()] = ev
			}
		}
	}
	if e := seen["EVENT_TYPE_CREATE new.txt"].GetEntry(); e.GetPath() != "w/new.txt" || e.GetSize() != 3 {
		t.Errorf("include_entry: entry %v", e)
	}
	bad, err := sb.fs.WatchDir(c, connect.NewRequest(&filesystem.WatchDirRequest{Path: "w/new.txt"}))
	if err == nil {
		bad.Receive()
		err = bad.Err()
		_ = bad.Close()
	}
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestWatcherCalls(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{Interval: 50 * time.Millisecond, PerSession: 2})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	if _, err := sb.fs.MakeDir(c, connect.NewRequest(&filesystem.MakeDirRequest{Path: "d"})); err != nil {
		t.Fatal(err)
	}
	cw, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "d"}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	sb.upload(t, "d/f.txt", "1")
	var got map[string]*filesystem.FilesystemEvent
	eventually(t, "the create event", func() bool {
		evs, err := sb.fs.GetWatcherEvents(c, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = eventSet(evs.Msg.GetEvents())
		return len(got) > 0
	})
	if got["EVENT_TYPE_CREATE f.txt"] == nil || len(got) != 1 {
		t.Errorf("events %v", got)
	}
	// A write that changes the size is a write; a chmod a chmod.
	sb.upload(t, "d/f.txt", "1234")
	stream, r := sb.start(t, c, bash("sleep 1.1; chmod 600 d/f.txt", false))
	wait(t, stream, r)
	seen := map[string]bool{}
	eventually(t, "the write and chmod events", func() bool {
		evs, err := sb.fs.GetWatcherEvents(c, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for k := range eventSet(evs.Msg.GetEvents()) {
			seen[k] = true
		}
		return seen["EVENT_TYPE_WRITE f.txt"] && seen["EVENT_TYPE_CHMOD f.txt"]
	})

	// The session's watchers are bounded.
	cw2, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "."}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "."}))
	wantCode(t, err, connect.CodeResourceExhausted)
	_, err = sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "missing"}))
	wantCode(t, err, connect.CodeResourceExhausted)

	// Another session does not see them.
	other := g.newSandbox(t, aliceKey)
	_, err = other.fs.GetWatcherEvents(c, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = other.fs.RemoveWatcher(c, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = other.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "missing"}))
	wantCode(t, err, connect.CodeNotFound)

	if _, err := sb.fs.RemoveWatcher(c, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = sb.fs.GetWatcherEvents(c, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	// Room again.
	cw3, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "d"}))
	if err != nil {
		t.Fatal(err)
	}

	// The directory going stops the watcher, which says so.
	if _, err := sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "d"})); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher to fail", func() bool {
		_, err := sb.fs.GetWatcherEvents(c, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: cw3.Msg.GetWatcherId()}))
		return code(err) == connect.CodeNotFound || code(err) == connect.CodeUnavailable
	})

	// Ending the session ends its watchers.
	if code := gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodDelete, "/v1/sessions/"+sb.id, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete session: %d", code)
	}
	_ = cw2
}

// A session that ends ends its streams with unavailable, saying the
// sandbox "was not found" (what the SDKs look for to raise
// SandboxNotRunningException); its watchers go.
func TestSessionEndEndsStreams(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{Interval: 50 * time.Millisecond})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	st, r := sb.start(t, c, bash("sleep 120", false))
	ws, err := sb.fs.WatchDir(c, connect.NewRequest(&filesystem.WatchDirRequest{Path: "."}))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if !ws.Receive() {
		t.Fatal(ws.Err())
	}
	if _, err := sb.fs.CreateWatcher(c, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "."})); err != nil {
		t.Fatal(err)
	}
	if code := gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodDelete, "/v1/sessions/"+sb.id, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete session: %d", code)
	}
	for st.Receive() {
		if r.add(t, st.Msg().GetEvent()) {
			t.Fatalf("an end event for a process whose session ended: %v", r.end)
		}
	}
	wantCode(t, st.Err(), connect.CodeUnavailable)
	if !strings.Contains(st.Err().Error(), "was not found") {
		t.Errorf("start stream: %v", st.Err())
	}
	for ws.Receive() {
	}
	wantCode(t, ws.Err(), connect.CodeUnavailable)
	if !strings.Contains(ws.Err().Error(), "was not found") {
		t.Errorf("watch stream: %v", ws.Err())
	}
}

// A stopped session's health is 502 "was not found", which the SDKs'
// is_running reads as not running.
func TestHealthOfAStoppedSandbox(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	if status, _, _ := sb.do(t, http.MethodGet, "/health", "", nil); status != http.StatusNoContent {
		t.Fatalf("health: %d", status)
	}
	if code := gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodPost, "/v1/sessions/"+sb.id+"/stop", nil, nil); code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	status, _, body := sb.do(t, http.MethodGet, "/health", "", nil)
	if status != http.StatusBadGateway || !strings.Contains(body, "was not found") {
		t.Errorf("health of a stopped sandbox: %d %s", status, body)
	}
}
