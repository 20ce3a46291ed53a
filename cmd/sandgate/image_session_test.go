package main

import (
	"archive/tar"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/internal/gwtest"
)

type imageSessionJSON struct {
	SessionID   string `json:"sessionId"`
	Image       string `json:"image"`
	ImageDigest string `json:"imageDigest"`
	SSH         struct {
		Password       string   `json:"password"`
		HostKeys       []string `json:"hostKeys"`
		KnownHostsLine string   `json:"knownHostsLine"`
	} `json:"ssh"`
}

// TestSessionsOnImages runs sessions on two OCI images pulled on demand
// from a registry on loopback, through the real binary: concurrent creates
// share one pull, OpenSSH's ssh and sftp work unchanged, `image rm` is
// refused while a session uses the image, and the sessions survive a
// restart on the same layers.
func TestSessionsOnImages(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	sftp := gwtest.RequireTool(t, "sftp")
	reg := imagestest.NewRegistry(t)
	mk := func(name, env string) (string, v1.Image) {
		img := imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin", "IMAGE_VAR=" + env}, WorkingDir: "/workspace"},
			imagestest.BusyboxLayer(t),
			imagestest.TarLayer(t, imagestest.Entry{Name: "etc/", Type: tar.TypeDir},
				imagestest.Entry{Name: "etc/image-name", Body: name + "\n"}))
		return reg.Push(t, "tools/"+name+":1", img), img
	}
	refA, imgA := mk("alpha", "a")
	refB, _ := mk("beta", "b")
	layers, _ := imgA.Layers()
	busybox, _ := layers[0].Digest()

	args := []string{"--sandbox", "linux", "--keep-sandboxes-on-exit=true", "--image-allow", reg.Host + "/tools/*"}
	g := startGateway(t, args...)

	// Four concurrent creates of one image: one pull.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var onA []imageSessionJSON
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s imageSessionJSON
			if code := gwtest.DoJSON(t, g.URL, g.Token, http.MethodPost, "/v1/sessions", map[string]any{"image": refA}, &s); code != http.StatusCreated {
				t.Errorf("create on %s: %d", refA, code)
				return
			}
			mu.Lock()
			onA = append(onA, s)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if n := reg.BlobGets(busybox); n != 1 {
		t.Errorf("4 concurrent creates fetched the base layer %d times, want 1", n)
	}
	var b imageSessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": refB}, &b); code != http.StatusCreated {
		t.Fatalf("create on %s: %d", refB, code)
	}
	a := onA[0]
	digestA, _ := imgA.Digest()
	if a.Image != refA || a.ImageDigest != digestA.String() {
		t.Errorf("session on A: image %q digest %q, want %q %q", a.Image, a.ImageDigest, refA, digestA)
	}

	exec := func(g *gatewayProc, s imageSessionJSON, cmd string) string {
		t.Helper()
		out, e, code := runClient(t, g.clientEnv(), nil, ssh, append(g.sshOpts(t, sessionJSON{SessionID: s.SessionID, SSH: s.SSH}), s.SessionID, cmd)...)
		if code != 0 {
			t.Fatalf("ssh %s %q: exit %d: %s", s.SessionID, cmd, code, e)
		}
		return out
	}
	want := map[string]string{a.SessionID: "alpha\na\nsandbox\n/workspace\n", b.SessionID: "beta\nb\nsandbox\n/workspace\n"}
	const probe = "cat /etc/image-name; echo $IMAGE_VAR; id -un; pwd"
	for _, s := range []imageSessionJSON{a, b} {
		if got := exec(g, s, probe); got != want[s.SessionID] {
			t.Errorf("%s: %q, want %q", s.SessionID, got, want[s.SessionID])
		}
	}

	// sftp in an image session: a round trip through the workspace.
	local := filepath.Join(t.TempDir(), "up")
	if err := os.WriteFile(local, []byte("through sftp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(t.TempDir(), "batch")
	os.WriteFile(batch, []byte("put "+local+" up.txt\nls\n"), 0o600)
	if _, e, code := runClient(t, g.clientEnv(), nil, sftp, append(append(g.sshOpts(t, sessionJSON{SessionID: a.SessionID, SSH: a.SSH}), "-b", batch), a.SessionID)...); code != 0 {
		t.Fatalf("sftp: exit %d: %s", code, e)
	}
	if got := exec(g, a, "cat /workspace/up.txt"); got != "through sftp\n" {
		t.Errorf("file put over sftp reads %q", got)
	}

	// An image the allow list does not cover.
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": "ghcr.io/elsewhere/x:1"}, &e); code != 400 || e.Error.Code != "unknown_image" || !strings.Contains(e.Error.Message, reg.Host+"/tools/*") {
		t.Errorf("unallowed image: %d %+v", code, e)
	}
	var list struct {
		Images []struct{ Name, Digest string } `json:"images"`
		Allow  []string                        `json:"allow"`
	}
	g.api(t, http.MethodGet, "/v1/images", nil, &list)
	if len(list.Images) != 2 || len(list.Allow) != 1 {
		t.Errorf("GET /v1/images: %+v", list)
	}

	// rm is refused while a session uses the image.
	if _, stderr, code := runImage(t, g.DataDir, "rm", refA); code == 0 || !strings.Contains(stderr, "session") {
		t.Errorf("image rm while in use: exit %d, %s", code, stderr)
	}

	// A restart keeps the sessions on their layers.
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token}
	g2.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token}, args...))
	for _, s := range []imageSessionJSON{a, b} {
		if got := exec(g2, s, probe); got != want[s.SessionID] {
			t.Errorf("after restart %s: %q, want %q", s.SessionID, got, want[s.SessionID])
		}
	}
	var again imageSessionJSON
	g2.api(t, http.MethodGet, "/v1/sessions/"+a.SessionID, nil, &again)
	if again.ImageDigest != a.ImageDigest {
		t.Errorf("after restart: imageDigest %q, want %q", again.ImageDigest, a.ImageDigest)
	}
	for _, s := range append(onA, b) {
		g2.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil)
	}
	if out, stderr, code := runImage(t, g.DataDir, "rm", refA); code != 0 {
		t.Errorf("image rm after the sessions ended: exit %d, %s%s", code, out, stderr)
	}
}
