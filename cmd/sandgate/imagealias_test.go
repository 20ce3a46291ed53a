//go:build linux

package main

import (
	"archive/tar"
	"net/http"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/internal/gwtest"
)

// --image-alias NAME=default: a fresh gateway (here without isolation,
// where no image runs) answers the image names clients ask for with the
// host-root image, by the name as given and in its normalised form;
// without the flag the same create is refused.
func TestImageAliasDefault(t *testing.T) {
	g := startGateway(t)
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": "python:3.11-slim"}, &e); code != http.StatusBadRequest {
		t.Fatalf("create on python:3.11-slim without an alias: %d %+v", code, e)
	}
	g.stop(t)

	g = startGateway(t, "--image-alias", "python:3.11-slim=default", "--image-alias", "node:20=default")
	for _, img := range []string{"python:3.11-slim", "docker.io/library/python:3.11-slim", "node:20"} {
		var s sessionJSON
		if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": img}, &s); code != http.StatusCreated {
			t.Fatalf("create on %s with an alias of default: %d\n%s", img, code, g.stderr.String())
		}
		if a := runREST(t, g, s.SessionID, map[string]any{"command": "echo ok"}); a.out() != "ok\n" {
			t.Errorf("%s: command said %q", img, a.out())
		}
	}
	if !strings.Contains(g.stderr.String(), "msg=image_alias name=python:3.11-slim image=default") {
		t.Errorf("the aliases are not logged:\n%s", g.stderr.String())
	}
	g.stop(t)

	for _, bad := range []string{"python", "=default", "python=", "Bad Name=default"} {
		out, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
			"--sandbox", "workdir", "--api-key", "k", "--image-alias", bad)
		if code != 2 || !strings.Contains(errOut, "--image-alias") {
			t.Errorf("--image-alias %q: exit %d %q %q", bad, code, out, errOut)
		}
	}
}

// On the linux driver an alias names a registry image, pulled on demand;
// and an image whose WORKDIR the sandbox user cannot write starts
// commands in /workspace, one it can write in its WORKDIR.
func TestImageAliasAndWorkDir(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	rootDir := reg.Push(t, "tools/rootdir:1", imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/app"},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t, imagestest.Entry{Name: "app/", Type: tar.TypeDir, Mode: 0o755})))
	userDir := reg.Push(t, "tools/userdir:1", imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/home/me"},
		imagestest.BusyboxLayer(t),
		imagestest.TarLayer(t, imagestest.Entry{Name: "home/", Type: tar.TypeDir},
			imagestest.Entry{Name: "home/me/", Type: tar.TypeDir, Mode: 0o755, UID: 1000, GID: 1000})))
	g := startGateway(t, "--sandbox", "linux", "--image-allow", reg.Host+"/tools/*",
		"--image-alias", "python:3.11-slim="+rootDir, "--image-alias", "mine="+userDir)
	for _, tc := range []struct{ image, wantDir string }{
		{"python:3.11-slim", "/workspace"}, {rootDir, "/workspace"}, {"mine", "/home/me"},
	} {
		var s imageSessionJSON
		if code := gwtest.DoJSON(t, g.URL, g.Token, http.MethodPost, "/v1/sessions", map[string]any{"image": tc.image}, &s); code != http.StatusCreated {
			t.Fatalf("create on %s: %d\n%s", tc.image, code, g.stderr.String())
		}
		a := runREST(t, g, s.SessionID, map[string]any{"command": "pwd; touch here && echo wrote; ls /app >/dev/null 2>&1 && echo has-app"})
		want := tc.wantDir + "\nwrote\n"
		if tc.wantDir == "/workspace" {
			want += "has-app\n"
		}
		if a.out() != want {
			t.Errorf("%s: %q, want %q", tc.image, a.out(), want)
		}
	}
}

// GET /v1/images lists the --image-alias names, as given and in the
// flags' order, with the image each stands for (normalised, or default);
// without the flag the list is empty.
func TestImageAliasListed(t *testing.T) {
	type alias struct{ Name, Image string }
	var list struct {
		Images  []any   `json:"images"`
		Aliases []alias `json:"aliases"`
	}
	g := startGateway(t)
	if code := g.api(t, http.MethodGet, "/v1/images", nil, &list); code != http.StatusOK || list.Aliases == nil || len(list.Aliases) != 0 {
		t.Fatalf("GET /v1/images without aliases: %d %+v", code, list)
	}
	g.stop(t)

	g = startGateway(t, "--image-alias", "python:3.11-slim=default", "--image-alias", "py=python:3.12", "--image-alias", " node:20 = default ")
	list.Aliases = nil
	if code := g.api(t, http.MethodGet, "/v1/images", nil, &list); code != http.StatusOK {
		t.Fatalf("GET /v1/images: %d", code)
	}
	want := []alias{{"python:3.11-slim", "default"}, {"py", "docker.io/library/python:3.12"}, {"node:20", "default"}}
	if len(list.Aliases) != len(want) {
		t.Fatalf("aliases = %+v, want %+v", list.Aliases, want)
	}
	for i := range want {
		if list.Aliases[i] != want[i] {
			t.Errorf("alias %d = %+v, want %+v", i, list.Aliases[i], want[i])
		}
	}
}
