package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

type restProcess struct {
	ProcessID   string     `json:"processId"`
	PID         int        `json:"pid"`
	Status      string     `json:"status"`
	ExitCode    *int       `json:"exitCode"`
	ExitSignal  string     `json:"exitSignal"`
	OutputBytes int64      `json:"outputBytes"`
	EndedAt     *time.Time `json:"endedAt"`
}

type restOutLine struct {
	Offset       *int64 `json:"offset"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	StdoutBase64 []byte `json:"stdoutBase64"`
	DroppedBytes int64  `json:"droppedBytes"`
	Truncated    string `json:"truncated"`
	Done         *bool  `json:"done"`
	ExitCode     *int   `json:"exitCode"`
	ExitSignal   string `json:"exitSignal"`
	NextOffset   *int64 `json:"nextOffset"`
}

// procClient drives one session's background processes over REST.
type procClient struct {
	g    *gatewayProc
	base string
}

func (c procClient) start(t *testing.T, body map[string]any) restProcess {
	t.Helper()
	var p restProcess
	if code := c.g.api(t, http.MethodPost, c.base, body, &p); code != http.StatusCreated {
		t.Fatalf("start %v: %d", body, code)
	}
	return p
}

func (c procClient) get(t *testing.T, id string) restProcess {
	t.Helper()
	var p restProcess
	if code := c.g.api(t, http.MethodGet, c.base+"/"+id, nil, &p); code != http.StatusOK {
		t.Fatalf("get %s: %d", id, code)
	}
	return p
}

func (c procClient) waitEnd(t *testing.T, id string) restProcess {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p := c.get(t, id); p.Status != "running" {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still running", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// output opens the output stream of process id; each line goes to the
// returned channel, closed at the end of the stream. cancel drops the
// connection.
func (c procClient) output(t *testing.T, id string, offset int64, follow bool) (<-chan restOutLine, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := fmt.Sprintf("%s%s/%s/output?offset=%d&follow=%t", c.g.URL, c.base, id, offset, follow)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.g.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("output: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	lines := make(chan restOutLine, 1024)
	go func() {
		defer close(lines)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l restOutLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("output line %q: %v", sc.Bytes(), err)
				return
			}
			lines <- l
		}
	}()
	t.Cleanup(cancel)
	return lines, cancel
}

// collect reads a whole output stream: the bytes from its first offset,
// the first offset, the dropped count, and the last line.
func collect(t *testing.T, lines <-chan restOutLine) (data []byte, first, dropped int64, last restOutLine) {
	t.Helper()
	first = -1
	next := int64(-1)
	timeout := time.After(120 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				if last.Done == nil {
					t.Fatal("the output stream ended without a done line")
				}
				return data, first, dropped, last
			}
			switch {
			case l.Done != nil:
				if next >= 0 && *l.NextOffset != next {
					t.Errorf("done line nextOffset %d, want %d", *l.NextOffset, next)
				}
				last = l
			case l.DroppedBytes > 0:
				dropped, next = l.DroppedBytes, *l.Offset
			default:
				if next >= 0 && *l.Offset != next {
					t.Fatalf("line at offset %d, want %d", *l.Offset, next)
				}
				if first < 0 {
					first = *l.Offset
				}
				chunk := append(append([]byte(l.Stdout), l.Stderr...), l.StdoutBase64...)
				data = append(data, chunk...)
				next = *l.Offset + int64(len(chunk))
			}
		case <-timeout:
			t.Fatal("the output stream did not end")
		}
	}
}

// seqLines is what `seq from to | sed s/^/line-/` writes.
func seqLines(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		b.WriteString("line-" + strconv.Itoa(i) + "\n")
	}
	return b.String()
}

// hostProcesses are the host's processes whose command line contains s.
func hostProcesses(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(bytes.ReplaceAll(cmdline, []byte{0}, []byte(" ")), []byte(s)) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestRESTProcesses(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--sandbox", driver)
			s := g.createSession(t)
			c := procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}

			t.Run("reattach-from-the-middle", func(t *testing.T) {
				p := c.start(t, map[string]any{"command": "echo begin; sleep 1; seq 1 10000 | sed s/^/line-/; exit 7", "name": "long"})
				lines, drop := c.output(t, p.ProcessID, 0, true)
				select {
				case l := <-lines:
					if l.Stdout != "begin\n" {
						t.Errorf("first line %+v", l)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no output while running")
				}
				drop() // the client goes away; the process goes on
				end := c.waitEnd(t, p.ProcessID)
				if end.Status != "exited" || end.ExitCode == nil || *end.ExitCode != 7 {
					t.Fatalf("after the drop: %+v", end)
				}
				mid := int64(len("begin\n") + len(seqLines(1, 4999)))
				lines, _ = c.output(t, p.ProcessID, mid, true)
				data, first, dropped, last := collect(t, lines)
				if first != mid || dropped != 0 || string(data) != seqLines(5000, 10000) {
					t.Errorf("from %d: first %d dropped %d, %d bytes (want lines 5000-10000)", mid, first, dropped, len(data))
				}
				if !*last.Done || last.ExitCode == nil || *last.ExitCode != 7 || *last.NextOffset != end.OutputBytes {
					t.Errorf("done line %+v, outputBytes %d", last, end.OutputBytes)
				}
			})

			t.Run("follow-as-produced", func(t *testing.T) {
				p := c.start(t, map[string]any{"argv": []string{"sh", "-c", "for i in 1 2 3 4; do echo tick $i; sleep 0.5; done"}})
				lines, _ := c.output(t, p.ProcessID, 0, true)
				t0 := time.Now()
				var got []string
				for l := range lines {
					if l.Done != nil {
						if !*l.Done || l.ExitCode == nil || *l.ExitCode != 0 {
							t.Errorf("done %+v", l)
						}
						break
					}
					if len(got) == 0 && time.Since(t0) > 1500*time.Millisecond {
						t.Errorf("the first line came after %v: not streamed", time.Since(t0))
					}
					got = append(got, l.Stdout)
				}
				if strings.Join(got, "") != "tick 1\ntick 2\ntick 3\ntick 4\n" {
					t.Errorf("followed %q", got)
				}
			})

			t.Run("stdin", func(t *testing.T) {
				p := c.start(t, map[string]any{"argv": []string{"cat"}})
				for _, body := range []map[string]any{{"data": "round "}, {"dataBase64": "dHJpcA==", "eof": true}} {
					if code := g.api(t, http.MethodPost, c.base+"/"+p.ProcessID+"/stdin", body, nil); code != http.StatusNoContent {
						t.Fatalf("stdin %v: %d", body, code)
					}
				}
				if end := c.waitEnd(t, p.ProcessID); end.Status != "exited" || *end.ExitCode != 0 {
					t.Errorf("cat after eof: %+v", end)
				}
				lines, _ := c.output(t, p.ProcessID, 0, false)
				if data, _, _, _ := collect(t, lines); string(data) != "round trip" {
					t.Errorf("cat echoed %q", data)
				}
			})

			t.Run("signal-and-ps", func(t *testing.T) {
				p := c.start(t, map[string]any{"command": "sleep 123457"})
				if p.PID <= 0 {
					t.Errorf("no pid: %+v", p)
				}
				ssh := gwtest.RequireTool(t, "ssh")
				opts := append(g.sshOpts(t, s), s.SessionID)
				out, errOut, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "ps -eo pid,args")...)
				if code != 0 {
					t.Fatalf("ssh ps: %d %s", code, errOut)
				}
				found := false
				for _, line := range strings.Split(out, "\n") {
					f := strings.Fields(line)
					if len(f) >= 3 && f[0] == strconv.Itoa(p.PID) && strings.Contains(line, "sleep 123457") {
						found = true
					}
				}
				if !found {
					t.Errorf("ps over SSH does not show pid %d running sleep 123457:\n%s", p.PID, out)
				}
				if code := g.api(t, http.MethodPost, c.base+"/"+p.ProcessID+"/signal", map[string]any{"signal": "TERM"}, nil); code != http.StatusNoContent {
					t.Fatalf("signal: %d", code)
				}
				if end := c.waitEnd(t, p.ProcessID); end.Status != "killed" || end.ExitSignal != "TERM" {
					t.Errorf("after TERM: %+v", end)
				}
				if code := g.api(t, http.MethodPost, c.base+"/"+p.ProcessID+"/signal", map[string]any{"signal": "TERM"}, nil); code != http.StatusConflict {
					t.Errorf("signal after the end: %d, want 409", code)
				}
			})

			t.Run("over-16MiB", func(t *testing.T) {
				p := c.start(t, map[string]any{"command": "seq 1 2500000"})
				end := c.waitEnd(t, p.ProcessID)
				var want strings.Builder
				for i := 1; i <= 2500000; i++ {
					want.WriteString(strconv.Itoa(i) + "\n")
				}
				total := int64(want.Len())
				if end.OutputBytes != total {
					t.Fatalf("outputBytes %d, want %d", end.OutputBytes, total)
				}
				lines, _ := c.output(t, p.ProcessID, 0, false)
				data, first, dropped, last := collect(t, lines)
				if dropped == 0 || first != dropped || first+int64(len(data)) != total {
					t.Fatalf("dropped %d, first %d, %d bytes kept of %d", dropped, first, len(data), total)
				}
				if kept := int64(len(data)); kept > 16<<20 || kept < 14<<20 {
					t.Errorf("kept %d bytes, want about 16 MiB", kept)
				}
				if string(data) != want.String()[first:] {
					t.Error("the bytes kept are not the output's last ones at their offsets")
				}
				if !*last.Done || *last.NextOffset != total {
					t.Errorf("done line %+v", last)
				}
			})

			t.Run("killed-with-the-session", func(t *testing.T) {
				marker := fmt.Sprintf("sleep %d", 200000+time.Now().UnixNano()%100000)
				s2 := g.createSession(t)
				c2 := procClient{g: g, base: "/v1/sessions/" + s2.SessionID + "/processes"}
				c2.start(t, map[string]any{"command": marker})
				c2.start(t, map[string]any{"argv": []string{"sh", "-c", "trap '' HUP TERM; " + marker}})
				// Start answers once the process is spawned; its exec of
				// sleep may come a moment later.
				for deadline := time.Now().Add(10 * time.Second); len(hostProcesses(marker)) < 2; time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%d sleeps running, want 2", len(hostProcesses(marker)))
					}
				}
				lines, _ := c2.output(t, "p1", 0, true)
				if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s2.SessionID, nil, nil); code != http.StatusNoContent {
					t.Fatalf("delete: %d", code)
				}
				_, _, _, last := collect(t, lines)
				if *last.Done {
					t.Errorf("a follower of a deleted session's process got %+v", last)
				}
				deadline := time.Now().Add(10 * time.Second)
				for len(hostProcesses(marker)) > 0 {
					if time.Now().After(deadline) {
						t.Fatalf("survivors of the deleted session: %v", hostProcesses(marker))
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
			g.stop(t)
		})
	}
}
