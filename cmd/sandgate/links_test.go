package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// curlGet fetches u with plain curl, no token: the status and body.
func curlGet(t *testing.T, u string, args ...string) (int, []byte) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	out := filepath.Join(t.TempDir(), "body")
	cmd := exec.Command("curl", append([]string{"-sS", "-o", out, "-w", "%{http_code}", u}, args...)...)
	cmd.Env = cleanEnv()
	code, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl %s: %v", u, err)
	}
	body, _ := os.ReadFile(out)
	status, err := strconv.Atoi(string(code))
	if err != nil {
		t.Fatalf("curl status %q: %v", code, err)
	}
	return status, body
}

// makeLink asks for a link to path of session id.
func makeLink(t *testing.T, g *gatewayProc, id, path string, expiresIn int) string {
	t.Helper()
	body := map[string]any{"path": path}
	if expiresIn > 0 {
		body["expiresIn"] = expiresIn
	}
	var l struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expiresAt"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/files/link", body, &l); code != http.StatusOK {
		t.Fatalf("link to %s: %d", path, code)
	}
	if !strings.HasPrefix(l.URL, g.URL+"/links/") {
		t.Fatalf("link %q is not on %s", l.URL, g.URL)
	}
	return l.URL
}

// retoken rewrites a link's token: edit gets its payload and signature.
func retoken(t *testing.T, link string, edit func(p map[string]any, sig []byte)) string {
	t.Helper()
	i := strings.LastIndex(link, "/links/") + len("/links/")
	enc, sigEnc, _ := strings.Cut(link[i:], ".")
	data, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(sigEnc)
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	edit(p, sig)
	data, _ = json.Marshal(p)
	return link[:i] + base64.RawURLEncoding.EncodeToString(data) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// linkShell runs command in session id over REST and fails unless it exits 0.
func linkShell(t *testing.T, g *gatewayProc, id, command string) {
	t.Helper()
	if a := runREST(t, g, id, map[string]any{"command": command}); a.ExitCode == nil || *a.ExitCode != 0 {
		t.Fatalf("%q: %+v", command, a)
	}
}

func TestLinks(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, filesDriverArgs(t, driver)...)
			id := createFilesSession(t, g, nil)
			base := "/v1/sessions/" + id + "/files?path="
			res, body := restFile(t, g, http.MethodPut, base+"pub.txt", strings.NewReader("public bytes"))
			wantStatus(t, "put", res, body, 201, "")

			// The key is kept in the data dir, private.
			if fi, err := os.Stat(filepath.Join(g.DataDir, "link-key")); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
				t.Errorf("link-key: %v %v", fi, err)
			}

			link := makeLink(t, g, id, "pub.txt", 0)
			if status, body := curlGet(t, link); status != 200 || string(body) != "public bytes" {
				t.Errorf("curl link: %d %q", status, body)
			}
			if status, body := curlGet(t, link, "-r", "7-11"); status != 206 || string(body) != "bytes" {
				t.Errorf("curl range: %d %q", status, body)
			}
			if strings.Contains(g.stderr.String()+g.stdout.String(), link[strings.LastIndexByte(link, '.')+1:]) {
				t.Error("the gateway logged a link's signature")
			}
			if !strings.Contains(g.stderr.String()+g.stdout.String(), "link_fetch") {
				t.Error("no link_fetch log")
			}

			// Tampering.
			for name, bad := range map[string]string{
				"signature": retoken(t, link, func(_ map[string]any, sig []byte) { sig[5] ^= 0x40 }),
				"path":      retoken(t, link, func(p map[string]any, _ []byte) { p["p"] = "/etc/shadow" }),
				"expiry":    retoken(t, link, func(p map[string]any, _ []byte) { p["e"] = p["e"].(float64) + 86400 }),
			} {
				status, body := curlGet(t, bad)
				if status != 403 || !bytes.Contains(body, []byte(`"code":"link_invalid"`)) {
					t.Errorf("tampered %s: %d %s", name, status, body)
				}
			}

			// Expiry.
			short := makeLink(t, g, id, "pub.txt", 1)
			time.Sleep(2100 * time.Millisecond)
			if status, body := curlGet(t, short); status != 403 || !bytes.Contains(body, []byte(`"code":"link_expired"`)) {
				t.Errorf("expired link: %d %s", status, body)
			}

			// A symlink swapped in after signing stays in the sandbox.
			shadow, _ := os.ReadFile("/etc/shadow")
			secret := filepath.Join(t.TempDir(), "host-secret")
			if err := os.WriteFile(secret, []byte("host-only-secret"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, target := range []string{"/etc/shadow", secret, "../../../../../../../../etc/shadow"} {
				res, body := restFile(t, g, http.MethodPut, base+"swap.txt", strings.NewReader("innocent"))
				wantStatus(t, "put swap", res, body, 201, "")
				swapped := makeLink(t, g, id, "swap.txt", 0)
				linkShell(t, g, id, "rm -f swap.txt && ln -s '"+target+"' swap.txt")
				status, body := curlGet(t, swapped)
				t.Logf("swap to %s: %d %.120s", target, status, body)
				if bytes.Contains(body, []byte("host-only-secret")) || (len(shadow) > 0 && bytes.Contains(body, shadow)) {
					t.Errorf("swap to %s leaked a host file: %d %q", target, status, body)
				}
				if driver == "workdir" && status == 200 {
					t.Errorf("swap to %s: 200 %q, want a refusal (outside the workdir)", target, body)
				}
				if status != 200 && !bytes.Contains(body, []byte(`"code"`)) {
					t.Errorf("swap to %s: %d %q", target, status, body)
				}
				linkShell(t, g, id, "rm -f swap.txt")
			}

			// Names.
			var named sessionJSON
			nameBody := map[string]any{"name": "links-" + driver}
			if code := g.api(t, http.MethodPost, "/v1/sessions", nameBody, &named); code != http.StatusCreated {
				t.Fatalf("create named: %d", code)
			}
			var errOut struct{ Error struct{ Code string } }
			if code := g.api(t, http.MethodPost, "/v1/sessions", nameBody, &errOut); code != http.StatusConflict || errOut.Error.Code != "name_taken" {
				t.Errorf("name clash: %d %q", code, errOut.Error.Code)
			}
			var list struct {
				Sessions []struct {
					SessionID string `json:"sessionId"`
					Name      string `json:"name"`
				} `json:"sessions"`
				Total int `json:"total"`
			}
			if code := g.api(t, http.MethodGet, "/v1/sessions?name="+url.QueryEscape("links-"+driver), nil, &list); code != 200 || list.Total != 1 || list.Sessions[0].SessionID != named.SessionID || list.Sessions[0].Name != "links-"+driver {
				t.Errorf("?name=: %d %+v", code, list)
			}
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+named.SessionID, nil, nil); code != http.StatusNoContent {
				t.Errorf("delete named: %d", code)
			}
			if code := g.api(t, http.MethodPost, "/v1/sessions", nameBody, &named); code != http.StatusCreated {
				t.Errorf("name reuse after delete: %d", code)
			}

			// Logs: a command and a background process's output.
			linkShell(t, g, id, "echo from-the-command")
			var proc struct {
				ProcessID string `json:"processId"`
			}
			if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/processes", map[string]any{"command": "echo proc-out-1; echo proc-out-2 >&2"}, &proc); code != http.StatusCreated {
				t.Fatalf("start process: %d", code)
			}
			var logs string
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				res, body := restFile(t, g, http.MethodGet, "/v1/sessions/"+id+"/logs?tail=50", nil)
				wantStatus(t, "logs", res, body, 200, "")
				if logs = string(body); strings.Contains(logs, "proc-out-2") {
					break
				}
			}
			for _, want := range []string{"echo from-the-command", "rest exit=0", "== process " + proc.ProcessID, "proc-out-1", "proc-out-2"} {
				if !strings.Contains(logs, want) {
					t.Errorf("logs lack %q:\n%s", want, logs)
				}
			}

			// The link dies with its session.
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
			if status, body := curlGet(t, link); status != 410 || !bytes.Contains(body, []byte(`"code":"link_gone"`)) {
				t.Errorf("link of a deleted session: %d %s", status, body)
			}
		})
	}
}

// TestLinkSurvivesRestart: the signing key is in the data dir, so a link
// made before a restart still works after it (on the new address), and the
// session's name still finds it.
func TestLinkSurvivesRestart(t *testing.T) {
	g := startGateway(t, "--keep-sandboxes-on-exit=true")
	id := createFilesSession(t, g, map[string]any{"name": "keeper"})
	res, body := restFile(t, g, http.MethodPut, "/v1/sessions/"+id+"/files?path=kept.txt", strings.NewReader("kept"))
	wantStatus(t, "put", res, body, 201, "")
	link := makeLink(t, g, id, "kept.txt", 0)
	g2 := restartWith(t, g, syscall.SIGTERM, "workdir")
	moved := g2.URL + strings.TrimPrefix(link, g.URL)
	if status, body := curlGet(t, moved); status != 200 || string(body) != "kept" {
		t.Errorf("link after a restart: %d %q", status, body)
	}
	var list struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
		} `json:"sessions"`
	}
	if code := g2.api(t, http.MethodGet, "/v1/sessions?name=keeper", nil, &list); code != 200 || len(list.Sessions) != 1 || list.Sessions[0].SessionID != id {
		t.Errorf("?name=keeper after a restart: %d %+v", code, list)
	}
	if code := g2.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}
