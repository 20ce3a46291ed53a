package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// tokenCanary is in the API keys of the audit tests: no token may reach
// the audit log or the gateway's log.
const tokenCanary = "tok-canary-5be1d07c93aa"

// readAudit reads every event of the audit log files under dir (current
// and rotated), oldest first by seq.
func readAudit(t *testing.T, path string) []audit.Event {
	t.Helper()
	files, _ := filepath.Glob(path + "*")
	var out []audit.Event
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e audit.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("%s: a line that is not an event: %q", f, sc.Text())
			}
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b audit.Event) int { return int(a.Seq) - int(b.Seq) })
	return out
}

// find returns the events that match all of want's non-zero fields
// (of those the tests use).
func find(events []audit.Event, want audit.Event) []audit.Event {
	var out []audit.Event
	for _, e := range events {
		if (want.Kind == "" || e.Kind == want.Kind) && (want.Session == "" || e.Session == want.Session) &&
			(want.Source == "" || e.Source == want.Source) && (want.Op == "" || e.Op == want.Op) &&
			(want.Path == "" || e.Path == want.Path) && (want.Command == "" || e.Command == want.Command) &&
			(want.RequestID == "" || e.RequestID == want.RequestID) && (want.Result == "" || e.Result == want.Result) &&
			(want.Route == "" || e.Route == want.Route) && (want.Host == "" || e.Host == want.Host) {
			out = append(out, e)
		}
	}
	return out
}

func requireOne(t *testing.T, events []audit.Event, want audit.Event) audit.Event {
	t.Helper()
	got := find(events, want)
	if len(got) != 1 {
		t.Fatalf("%d events like %+v, want 1; all events:\n%s", len(got), want, dumpEvents(events))
	}
	return got[0]
}

func dumpEvents(events []audit.Event) string {
	var b strings.Builder
	for _, e := range events {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// apiReq sends a REST request with a request id and returns the status
// and body.
func apiReq(t *testing.T, g *gatewayProc, token, method, path, reqID string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestAuditTrail drives every kind of event through the real binary:
// REST calls, ssh exec and a shell and sftp put/get over OpenSSH, REST
// commands and files, a kernel call, egress, lifecycle; each carries its
// request id, the gateway's log lines carry it too, and neither holds a
// token or a secret's value. Tenants see only their own events.
func TestAuditTrail(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	sftp := gwtest.RequireTool(t, "sftp")
	python := gwtest.RequireTool(t, "python3")
	curl := gwtest.RequireTool(t, "curl")
	_ = python
	_, httpPort := upstream(t, nil)
	secrets := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(secrets, []byte("CANARY_TOKEN="+canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	alice, bob := "alice-"+tokenCanary, "bob-"+tokenCanary
	g := startGateway(t, "--api-key", "alice:"+alice, "--api-key", "bob:"+bob, "--secrets-file", secrets,
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "allowed.test=127.0.0.1", "--egress-resolve", "denied.test=127.0.0.1")
	g.Token = alice
	auditPath := filepath.Join(g.DataDir, "audit.log")

	// Create, with a request id of the client's.
	code, body := apiReq(t, g, alice, http.MethodPost, "/v1/sessions", "rid-create-1",
		strings.NewReader(`{"secrets":["CANARY_TOKEN"],"egress":["allowed.test:`+httpPort+`"]}`))
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var s sessionJSON
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	id := s.SessionID

	// REST: a command, a file written and read, a kernel call.
	if code, b := apiReq(t, g, alice, http.MethodPost, "/v1/sessions/"+id+"/commands", "rid-cmd-1",
		strings.NewReader(`{"command":"test -n \"$CANARY_TOKEN\"; exit 5"}`)); code != http.StatusOK {
		t.Fatalf("command: %d %s", code, b)
	}
	// A client that types a secret's value: the audit keeps its name.
	if code, b := apiReq(t, g, alice, http.MethodPost, "/v1/sessions/"+id+"/commands", "rid-cmd-2",
		strings.NewReader(`{"command":"test \"$CANARY_TOKEN\" = `+canary+`"}`)); code != http.StatusOK {
		t.Fatalf("command: %d %s", code, b)
	}
	if code, b := apiReq(t, g, alice, http.MethodPost, "/v1/sessions/"+id+"/python", "rid-py-2",
		strings.NewReader(`{"code":"import os\nassert os.environ['CANARY_TOKEN'] == '`+canary+`'"}`)); code != http.StatusOK {
		t.Fatalf("python: %d %s", code, b)
	}
	if code, b := apiReq(t, g, alice, http.MethodPut, "/v1/sessions/"+id+"/files?path=rest.txt", "rid-put-1",
		strings.NewReader("twelve bytes")); code != http.StatusCreated {
		t.Fatalf("put: %d %s", code, b)
	}
	if code, b := apiReq(t, g, alice, http.MethodGet, "/v1/sessions/"+id+"/files?path=rest.txt", "rid-get-1", nil); code != http.StatusOK {
		t.Fatalf("get: %d %s", code, b)
	}
	if code, b := apiReq(t, g, alice, http.MethodGet, "/v1/sessions/"+id+"/files?path=missing.txt", "rid-get-2", nil); code != http.StatusNotFound {
		t.Fatalf("get of a missing file: %d %s", code, b)
	}
	if code, b := apiReq(t, g, alice, http.MethodPost, "/v1/sessions/"+id+"/python", "rid-py-1",
		strings.NewReader(`{"code":"x = 6 * 7\nx"}`)); code != http.StatusOK {
		t.Fatalf("python: %d %s", code, b)
	}

	// SSH: exec, a shell, and sftp put/get of 1 MiB, rename, mkdir, rm.
	opts := g.sshOpts(t, s)
	if _, _, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, id, "exit 7")...); code != 7 {
		t.Fatalf("ssh exit 7: %d", code)
	}
	if _, _, code := runClient(t, g.clientEnv(), strings.NewReader("exit 4\n"), ssh, append(opts, "-tt", id)...); code != 4 {
		t.Fatalf("ssh shell: %d", code)
	}
	dir := t.TempDir()
	data := make([]byte, 1<<20)
	rand.Read(data)
	local := filepath.Join(dir, "up.bin")
	os.WriteFile(local, data, 0o644)
	batch := filepath.Join(dir, "batch")
	os.WriteFile(batch, []byte(strings.Join([]string{
		"put " + local + " up.bin",
		"get up.bin " + filepath.Join(dir, "back.bin"),
		"mkdir d",
		"rename up.bin d/moved.bin",
		"rm d/moved.bin",
		"-mkdir d", // fails: it exists
		"-get missing.bin " + filepath.Join(dir, "missing.bin"), // fails: a stat that finds nothing
		"ls d",
	}, "\n")+"\n"), 0o644)
	if out, errOut, code := runClient(t, g.clientEnv(), nil, sftp, append(opts, "-b", batch, id)...); code != 0 {
		t.Fatalf("sftp: %d\n%s\n%s", code, out, errOut)
	}

	// Egress: one allowed, one denied (not on the list), through the
	// session's proxy (HTTP_PROXY in the command's environment).
	for _, host := range []string{"allowed.test", "denied.test"} {
		runClient(t, g.clientEnv(), nil, ssh, append(opts, id, curl+" -s -o /dev/null http://"+host+":"+httpPort+"/")...)
	}

	// Lifecycle: bob's session, deleted by bob.
	bs := struct{ SessionID string }{}
	if code := gwtest.DoJSON(t, g.URL, bob, http.MethodPost, "/v1/sessions", map[string]any{}, &bs); code != http.StatusCreated {
		t.Fatalf("bob's create: %d", code)
	}
	if code := gwtest.DoJSON(t, g.URL, bob, http.MethodDelete, "/v1/sessions/"+bs.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("bob's delete: %d", code)
	}
	// A failed authentication: no tenant, no token in the event.
	apiReq(t, g, "wrong-"+tokenCanary, http.MethodGet, "/v1/sessions", "rid-401", nil)

	// The egress events come when the proxied connections end.
	var events []audit.Event
	deadline := time.Now().Add(20 * time.Second)
	for {
		events = readAudit(t, auditPath)
		if len(find(events, audit.Event{Kind: audit.KindEgress})) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("rest", func(t *testing.T) {
		created := requireOne(t, events, audit.Event{Kind: audit.KindSession, Session: id, Op: "created"})
		if created.RequestID != "rid-create-1" || created.Tenant != "alice" || created.Auth != "api_key" {
			t.Errorf("created: %+v", created)
		}
		call := requireOne(t, events, audit.Event{Kind: audit.KindREST, RequestID: "rid-create-1"})
		if call.Route != "/v1/sessions" || call.Status != 201 || call.Session != id || call.Method != "POST" {
			t.Errorf("create call: %+v", call)
		}
		call = requireOne(t, events, audit.Event{Kind: audit.KindREST, RequestID: "rid-401"})
		if call.Status != 401 || call.Tenant != "" || call.Result != "unauthorized" {
			t.Errorf("401 call: %+v", call)
		}
	})
	t.Run("commands", func(t *testing.T) {
		c := requireOne(t, events, audit.Event{Kind: audit.KindCommand, Source: "rest", RequestID: "rid-cmd-1"})
		if c.ExitCode == nil || *c.ExitCode != 5 || c.Session != id || !strings.Contains(c.Command, "$CANARY_TOKEN") {
			t.Errorf("REST command: %+v", c)
		}
		c = requireOne(t, events, audit.Event{Kind: audit.KindCommand, Source: "ssh", Command: "exit 7"})
		if c.ExitCode == nil || *c.ExitCode != 7 || c.RequestID == "" || c.Tenant != "alice" {
			t.Errorf("ssh exec: %+v", c)
		}
		// The exec's request id is its tunnel's.
		requireOne(t, events, audit.Event{Kind: audit.KindTunnelOpen, RequestID: c.RequestID})
		closed := requireOne(t, events, audit.Event{Kind: audit.KindTunnelClose, RequestID: c.RequestID})
		if closed.BytesIn == 0 || closed.BytesOut == 0 || closed.Session != id {
			t.Errorf("tunnel close: %+v", closed)
		}
		if auth := requireOne(t, events, audit.Event{Kind: audit.KindSSHAuth, RequestID: c.RequestID}); auth.Result != "ok" || auth.Auth == "" {
			t.Errorf("ssh auth: %+v", auth)
		}
		sh := requireOne(t, events, audit.Event{Kind: audit.KindCommand, Source: "shell", Session: id})
		if sh.ExitCode == nil || *sh.ExitCode != 4 {
			t.Errorf("shell: %+v", sh)
		}
		c = requireOne(t, events, audit.Event{Kind: audit.KindCommand, RequestID: "rid-cmd-2"})
		if c.Command != `test "$CANARY_TOKEN" = [secret:CANARY_TOKEN]` || c.ExitCode == nil || *c.ExitCode != 0 {
			t.Errorf("a command with a secret's value: %+v", c)
		}
		k := requireOne(t, events, audit.Event{Kind: audit.KindCommand, RequestID: "rid-py-2"})
		if !strings.Contains(k.Command, "== '[secret:CANARY_TOKEN]'") || k.Result != "ok" {
			t.Errorf("a kernel call with a secret's value: %+v", k)
		}
		k = requireOne(t, events, audit.Event{Kind: audit.KindCommand, Source: "kernel", RequestID: "rid-py-1"})
		if k.Command != "x = 6 * 7\nx" || k.Result != "ok" || k.Session != id {
			t.Errorf("kernel: %+v", k)
		}
	})
	t.Run("files", func(t *testing.T) {
		for _, w := range []struct {
			e     audit.Event
			bytes int64
		}{
			{audit.Event{Source: "rest", Op: "write", Path: "rest.txt", RequestID: "rid-put-1", Result: "ok"}, 12},
			{audit.Event{Source: "rest", Op: "read", Path: "rest.txt", RequestID: "rid-get-1", Result: "ok"}, 12},
			{audit.Event{Source: "rest", Op: "read", Path: "missing.txt", RequestID: "rid-get-2", Result: "file_not_found"}, 0},
			{audit.Event{Source: "sftp", Op: "write", Result: "ok"}, 1 << 20},
			{audit.Event{Source: "sftp", Op: "read", Result: "ok"}, 1 << 20},
			{audit.Event{Source: "sftp", Op: "mkdir", Result: "failure"}, 0},
			{audit.Event{Source: "sftp", Op: "mkdir", Result: "ok"}, 0},
			{audit.Event{Source: "sftp", Op: "rename", Result: "ok"}, 0},
			{audit.Event{Source: "sftp", Op: "remove", Result: "ok"}, 0},
		} {
			w.e.Kind, w.e.Session = audit.KindFile, id
			got := requireOne(t, events, w.e)
			if got.Bytes != w.bytes || got.Tenant != "alice" || got.RequestID == "" || got.Path == "" {
				t.Errorf("%+v: got %+v, want %d bytes", w.e, got, w.bytes)
			}
		}
		// Reads of metadata: a get of a missing file is a stat that failed.
		var missing, listed int
		for _, e := range find(events, audit.Event{Kind: audit.KindFile, Session: id, Source: "sftp"}) {
			if e.Op == "stat" && strings.HasSuffix(e.Path, "/missing.bin") && e.Result == "no_such_file" {
				missing++
			}
			if e.Op == "list" && strings.HasSuffix(strings.TrimSuffix(e.Path, "/"), "/d") && e.Result == "ok" {
				listed++
			}
		}
		if missing != 1 || listed != 1 {
			t.Errorf("sftp stat of missing.bin: %d events, ls d: %d, want 1 each:\n%s", missing, listed, dumpEvents(events))
		}
		if mv := requireOne(t, events, audit.Event{Kind: audit.KindFile, Op: "rename"}); !strings.HasSuffix(mv.Path, "up.bin") || !strings.HasSuffix(mv.Target, "d/moved.bin") {
			t.Errorf("rename: %+v", mv)
		}
	})
	t.Run("egress", func(t *testing.T) {
		ok := requireOne(t, events, audit.Event{Kind: audit.KindEgress, Host: "allowed.test"})
		no := requireOne(t, events, audit.Event{Kind: audit.KindEgress, Host: "denied.test"})
		if ok.Result != "allowed" || ok.BytesIn == 0 || no.Result != "denied" || no.Reason == "" || ok.Session != id || ok.Tenant != "alice" {
			t.Errorf("egress: %+v / %+v", ok, no)
		}
	})
	t.Run("lifecycle", func(t *testing.T) {
		del := requireOne(t, events, audit.Event{Kind: audit.KindSession, Session: bs.SessionID, Op: "deleted"})
		if del.By != "bob" || del.Tenant != "bob" {
			t.Errorf("deleted: %+v", del)
		}
	})
	t.Run("request-id-in-log-lines", func(t *testing.T) {
		logs := g.stderr.String()
		var created string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "msg=session_created session="+id) {
				created = l
			}
		}
		if !strings.Contains(created, "request_id=rid-create-1") {
			t.Errorf("session_created line without its request id: %q", created)
		}
		// Every log line of the ssh exec's tunnel names its request.
		exec := requireOne(t, events, audit.Event{Kind: audit.KindCommand, Source: "ssh", Command: "exit 7"})
		n := 0
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "request_id="+exec.RequestID) {
				n++
			}
		}
		// tunnel_opened, ssh_auth, exec_started, exec_finished
		if n < 4 {
			t.Errorf("%d log lines name the exec's request %s:\n%s", n, exec.RequestID, logs)
		}
	})
	t.Run("tenant-query", func(t *testing.T) {
		var page struct {
			Events []audit.Event `json:"events"`
		}
		if code := gwtest.DoJSON(t, g.URL, bob, http.MethodGet, "/v1/audit?limit=1000", nil, &page); code != http.StatusOK {
			t.Fatalf("bob's query: %d", code)
		}
		if len(page.Events) == 0 {
			t.Error("bob sees none of his own events")
		}
		for _, e := range page.Events {
			if e.Tenant != "bob" || e.Session == id {
				t.Errorf("bob sees %+v", e)
			}
		}
		if code := gwtest.DoJSON(t, g.URL, bob, http.MethodGet, "/v1/audit?session="+id, nil, &page); code != http.StatusOK || len(page.Events) != 0 {
			t.Errorf("bob's query of alice's session: %d, %d events", code, len(page.Events))
		}
		if code := gwtest.DoJSON(t, g.URL, alice, http.MethodGet, "/v1/audit?limit=1000&session="+id, nil, &page); code != http.StatusOK {
			t.Fatalf("alice's query: %d", code)
		}
		if want := len(find(events, audit.Event{Session: id})); len(page.Events) < want {
			t.Errorf("alice's query of her session: %d events, the file has %d", len(page.Events), want)
		}
	})
	t.Run("canaries", func(t *testing.T) {
		raw, _ := os.ReadFile(auditPath)
		for _, c := range []string{canary, tokenCanary} {
			if bytes.Contains(raw, []byte(c)) {
				t.Errorf("the audit log holds canary %q", c)
			}
			if strings.Contains(g.stderr.String(), c) {
				t.Errorf("the gateway's log holds canary %q", c)
			}
		}
	})
}

// TestAuditConcurrentCommands: 100 concurrent REST commands make exactly
// 100 command events, each with its own request id.
func TestAuditConcurrentCommands(t *testing.T) {
	g := startGateway(t, "--rate-limit", "0")
	s := g.createSession(t)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+s.SessionID+"/commands",
				strings.NewReader(fmt.Sprintf(`{"command":"echo %d"}`, i)))
			req.Header.Set("Authorization", "Bearer "+g.Token)
			req.Header.Set("X-Request-Id", fmt.Sprintf("rid-%03d", i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("command %d: %d", i, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	events := readAudit(t, filepath.Join(g.DataDir, "audit.log"))
	cmds := find(events, audit.Event{Kind: audit.KindCommand, Session: s.SessionID, Source: "rest"})
	ids := map[string]bool{}
	for _, e := range cmds {
		ids[e.RequestID] = true
	}
	if len(cmds) != 100 || len(ids) != 100 {
		t.Errorf("%d command events with %d request ids, want 100", len(cmds), len(ids))
	}
	for i, e := range events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: the sequence has a gap", i, e.Seq)
		}
	}
}

// TestAuditRotation: past --audit-max-size the log rotates, keeping
// --audit-max-files files; the sequence goes on across files and a
// restart, and GET /v1/audit reads the rotated files too.
func TestAuditRotation(t *testing.T) {
	g := startGateway(t, "--audit-max-size", "4096", "--audit-max-files", "3", "--rate-limit", "0")
	path := filepath.Join(g.DataDir, "audit.log")
	for range 60 {
		g.api(t, http.MethodGet, "/v1/sessions", nil, nil)
	}
	for _, f := range []string{path, path + ".1", path + ".2"} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if st.Size() > 4096 {
			t.Errorf("%s is %d bytes, past --audit-max-size", f, st.Size())
		}
	}
	if _, err := os.Stat(path + ".3"); err == nil {
		t.Error("a fourth file is kept")
	}
	kept := readAudit(t, path)
	for i := 1; i < len(kept); i++ {
		if kept[i].Seq != kept[i-1].Seq+1 {
			t.Fatalf("seq %d follows %d", kept[i].Seq, kept[i-1].Seq)
		}
	}
	var page struct {
		Events []audit.Event `json:"events"`
	}
	if code := g.api(t, http.MethodGet, "/v1/audit?limit=1000", nil, &page); code != http.StatusOK {
		t.Fatalf("query: %d", code)
	}
	if len(page.Events) != len(kept) || page.Events[len(page.Events)-1].Seq != kept[0].Seq {
		t.Errorf("the query gave %d events, the files hold %d from seq %d", len(page.Events), len(kept), kept[0].Seq)
	}
	// A restart carries the sequence on. The log is read once the gateway
	// has exited: a request's event is written when its handler returns,
	// which the client may not wait for.
	g.stop(t)
	last := readAudit(t, path)
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token}
	g2.start(t, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", "workdir",
		"--api-key", g.Token, "--keep-sandboxes-on-exit=false", "--audit-max-size", "4096", "--audit-max-files", "3"})
	g2.api(t, http.MethodGet, "/v1/sessions", nil, nil)
	g2.stop(t)
	after := readAudit(t, path)
	if got, want := after[len(after)-1].Seq, last[len(last)-1].Seq+1; got != want {
		t.Errorf("after a restart the next seq is %d, want %d", got, want)
	}
}

// TestAuditFullDisk: an audit log that cannot be written (/dev/full:
// ENOSPC on every write) fails no request; the failures are counted in
// /metrics and logged once.
func TestAuditFullDisk(t *testing.T) {
	g := startGateway(t, "--audit-log", "/dev/full", "--metrics-token", "m-token")
	s := g.createSession(t)
	for range 5 {
		var out struct{ ExitCode *int }
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands", map[string]any{"command": "true"}, &out); code != http.StatusOK {
			t.Fatalf("command with a full audit disk: %d", code)
		}
	}
	if n := strings.Count(g.stderr.String(), "msg=audit_write_failed"); n != 1 {
		t.Errorf("audit_write_failed logged %d times, want once", n)
	}
	code, _, body := scrapeMetrics(t, g.URL+"/metrics", "m-token")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "sandgate_audit_write_failures_total ") {
			if strings.TrimPrefix(l, "sandgate_audit_write_failures_total ") == "0" {
				t.Error("no audit write failure counted")
			}
			return
		}
	}
	t.Error("no sandgate_audit_write_failures_total in /metrics")
}

// TestAuditIdleExpiry: the reaper's expiry is in the audit with its reason.
func TestAuditIdleExpiry(t *testing.T) {
	g := startGateway(t, "--idle-timeout", "1s")
	s := g.createSession(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := find(readAudit(t, filepath.Join(g.DataDir, "audit.log")), audit.Event{Kind: audit.KindSession, Session: s.SessionID, Op: "expired"})
		if len(got) == 1 {
			if got[0].Reason != "idle" || got[0].Tenant != "default" {
				t.Errorf("expired: %+v", got[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no expired event")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
