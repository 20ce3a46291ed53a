package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
)

// listNames lists the names in dir of session id (hidden ones included).
func listNames(t *testing.T, g *gatewayProc, id, dir string) []string {
	t.Helper()
	res, body := restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/files?list=true&path="+dir, nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("list %s: %d %s", dir, res.StatusCode, body)
	}
	var l struct{ Entries []struct{ Name string } }
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name)
	}
	return names
}

func uploadTemps(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, ".sandgate-upload-") {
			out = append(out, n)
		}
	}
	return out
}

// TestRESTPutCrash: a REST PUT cut off by a crash of the gateway (kill -9)
// leaves its start in the audit log (result started, and no outcome), and
// its temporary file is removed when the next gateway re-adopts the
// session (issue 35, items 8 and 11). Before, the hidden
// .sandgate-upload-*.tmp stayed forever and the audit log had nothing.
func TestRESTPutCrash(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--keep-sandboxes-on-exit=true", "--sandbox", driver)
			id := createFilesSession(t, g, nil)
			res, body := restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path=dir/keep.txt&mkdirs=true", strings.NewReader("kept"))
			wantStatus(t, "put", res, body, http.StatusCreated, "")

			// A PUT whose body stops after 1 MiB: its bytes are in the temporary file.
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.Close() })
			go func() {
				_, _ = pw.Write(make([]byte, 1<<20))
			}()
			req, _ := http.NewRequest(http.MethodPut, g.URL+"/v1/sessions/"+id+"/files?path=dir/big.bin", pr)
			req.Header.Set("Authorization", "Bearer "+g.Token)
			req.Header.Set("X-Request-Id", "rid-cut-off")
			go func() {
				if res, err := http.DefaultClient.Do(req); err == nil {
					res.Body.Close()
				}
			}()
			deadline := time.Now().Add(30 * time.Second)
			for len(uploadTemps(listNames(t, g, id, "dir"))) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the upload's temporary file never appeared")
				}
				time.Sleep(50 * time.Millisecond)
			}

			g2 := restartWith(t, g, syscall.SIGKILL, driver)
			deadline = time.Now().Add(30 * time.Second)
			var names []string
			for {
				names = listNames(t, g2, id, "dir")
				if len(uploadTemps(names)) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the restart the cut-off upload's temporary file is still there: %q", names)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if strings.Join(names, ",") != "keep.txt" {
				t.Errorf("after the restart: %q, want keep.txt alone", names)
			}

			// The audit log has the write's start, and no outcome: the gateway died.
			events := readAudit(t, filepath.Join(g.DataDir, "audit.log"))
			started := find(events, audit.Event{Kind: audit.KindFile, Source: "rest", Op: "write", RequestID: "rid-cut-off"})
			if len(started) != 1 || started[0].Result != audit.ResultStarted || started[0].Path != "dir/big.bin" || started[0].Session != id {
				t.Errorf("audit events of the cut-off write: %+v, want one started", started)
			}
			// A write that completes has both.
			done := find(events, audit.Event{Kind: audit.KindFile, Source: "rest", Op: "write", Path: "dir/keep.txt"})
			if len(done) != 2 || done[0].Result != audit.ResultStarted || done[1].Result != "ok" || done[1].Bytes != 4 {
				t.Errorf("audit events of a complete write: %+v, want started then ok", done)
			}
		})
	}
}
