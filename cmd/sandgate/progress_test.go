//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// `sandgate image pull --json` prints the pull's progress as JSON lines,
// growing to the layers' whole size, then the result; on a terminal it
// draws a bar instead; elsewhere only the result line.
func TestImagePullProgress_Root(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (layers keep image owners); run the suite as root")
	}
	reg := imagestest.NewRegistryAt(t, "127.0.0.2:0")
	mk := func(repo string, seed uint64) string {
		return reg.Push(t, repo, imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}},
			imagestest.RandomLayer(t, "data/blob", 4<<20, seed)))
	}
	refJSON, refTTY, refPlain := mk("p/json:1", 1), mk("p/tty:1", 2), mk("p/plain:1", 3)
	data := t.TempDir()

	out, errOut, code := runImage(t, data, "pull", "--insecure", "--json", refJSON)
	if code != 0 {
		t.Fatalf("pull --json: exit %d %s", code, errOut)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		lines = append(lines, m)
	}
	if len(lines) < 4 || len(lines) > 110 {
		t.Fatalf("pull --json: %d lines, want a few per pull and at most about one per percent:\n%s", len(lines), out)
	}
	last := lines[len(lines)-1]
	if last["status"] != "pulled" || last["digest"] == nil || last["layers"] != 1.0 {
		t.Errorf("last line: %v", last)
	}
	prev, total := -1.0, 0.0
	for _, m := range lines[:len(lines)-1] {
		c, _ := m["complete"].(float64)
		total, _ = m["total"].(float64)
		if m["status"] != "pulling" || m["ref"] != refJSON || c < prev || total < 4<<20 {
			t.Errorf("progress line %v after complete=%v", m, prev)
		}
		prev = c
	}
	if prev != total {
		t.Errorf("the last progress line says %v of %v bytes", prev, total)
	}

	// On a terminal: a bar redrawn in place, ending at 100%.
	cmd := exec.Command(sandgateBin, "image", "pull", "--insecure", "--data-dir", data, refTTY)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	f, err := pty.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var tty bytes.Buffer
	_, _ = io.Copy(&tty, f) // until the child exits (EIO)
	f.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("pull on a terminal: %v\n%s", err, tty.String())
	}
	if s := tty.String(); strings.Count(s, "\r"+refTTY+" [") < 3 || !strings.Contains(s, "100%") || !strings.Contains(s, "pulled "+refTTY) {
		t.Errorf("pull on a terminal drew no bar:\n%q", s)
	}

	// Neither a terminal nor --json: the result line alone.
	out, errOut, code = runImage(t, data, "pull", "--insecure", refPlain)
	if code != 0 || !strings.HasPrefix(out, "pulled "+refPlain) || strings.Count(out, "\n") != 1 || errOut != "" {
		t.Errorf("plain pull: exit %d stdout %q stderr %q", code, out, errOut)
	}
}

// A create that pulls its image on demand logs the pull in a few lines:
// its start (layers, bytes), at most a line per quarter, and its end.
func TestOnDemandPullLogsProgress(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "tools/big:1", imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}},
		imagestest.BusyboxLayer(t), imagestest.RandomLayer(t, "data/blob", 8<<20, 7)))
	g := startGateway(t, "--sandbox", "linux", "--image-allow", reg.Host+"/tools/*")
	var s imageSessionJSON
	if code := gwtest.DoJSON(t, g.URL, g.Token, http.MethodPost, "/v1/sessions", map[string]any{"image": ref}, &s); code != http.StatusCreated {
		t.Fatalf("create on %s: %d\n%s", ref, code, g.stderr.String())
	}
	log := g.stderr.String()
	var started, progress, pulled int
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "msg=image_pull_started") && strings.Contains(l, "layers=2") && strings.Contains(l, "bytes="):
			started++
		case strings.Contains(l, "msg=image_pull_progress"):
			progress++
		case strings.Contains(l, "msg=image_pulled"):
			pulled++
		}
	}
	if started != 1 || pulled != 1 || progress > 3 {
		t.Errorf("on-demand pull logged %d starts, %d progress lines, %d ends; want 1, at most 3, 1:\n%s", started, progress, pulled, log)
	}
}

// Workspace syncs log their start, their end with the bytes, and the
// push to the object store with the bytes uploaded, at info level.
func TestWorkspaceSyncLogs(t *testing.T) {
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--workspace-sync-interval", "1h")...)
	logOnFailure(t, g)
	if code := g.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "logged"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d", code)
	}
	id, code, _ := createWith(t, g, g.Token, map[string]any{"workspace": "logged"})
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	wsRun(t, g, g.Token, id, "head -c 300000 /dev/urandom > f")
	deleteSession(t, g, g.Token, id, "")
	waitSynced(t, g, g.Token, "logged")
	// The push of the files (300 kB and the manifest) is logged once done.
	pushed := regexp.MustCompile(`level=INFO msg=workspace_pushed key=\S+ delete=false uploaded_bytes=3\d{5} `)
	for deadline := time.Now().Add(60 * time.Second); !pushed.MatchString(g.stderr.String()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no workspace_pushed line with the bytes uploaded")
		}
	}
	log := g.stderr.String()
	for _, want := range []string{
		"level=INFO msg=workspace_sync_started workspace=logged session=" + id + " reason=session_delete",
		"level=INFO msg=workspace_synced workspace=logged session=" + id + " reason=session_delete bytes=300000 files=1 stored_bytes=300000",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
}
