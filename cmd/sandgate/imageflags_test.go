package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/images/imagestest"
)

// imageSourceFor builds the gateway's image source as serve does, from
// serve's flags, in a fresh data dir.
func imageSourceFor(t *testing.T, args ...string) *imageSource {
	t.Helper()
	return imageSourceProxied(t, "", args...)
}

// imageSourceProxied is imageSourceFor with HTTP_PROXY and HTTPS_PROXY
// set to proxy.
func imageSourceProxied(t *testing.T, proxy string, args ...string) *imageSource {
	t.Helper()
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"} {
		t.Setenv(v, "")
	}
	t.Setenv("HTTP_PROXY", proxy)
	t.Setenv("HTTPS_PROXY", proxy)
	cfg, err := parseServe(append([]string{"--data-dir", t.TempDir()}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	eg, err := cfg.egress.config(log, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := cfg.images.open(cfg, eg.Proxy, log)
	if err != nil {
		t.Fatal(err)
	}
	src, err := newImageSource(store, cfg.imageAllow, true, cfg.insecureRegistry, log)
	if err != nil {
		t.Fatal(err)
	}
	src.pulls.max = cfg.images.pullsPerTenant
	return src
}

// resolveCode is the API code of Resolve's error for name.
func resolveCode(t *testing.T, src *imageSource, name string) (string, string) {
	t.Helper()
	_, err := src.Resolve(context.Background(), name)
	var ge *gateway.Error
	if !errors.As(err, &ge) {
		t.Fatalf("resolve %s: %v; want a gateway error", name, err)
	}
	return ge.Code, ge.Message
}

// A registry the operator allowed (127.0.0.1:PORT/*) is reached on
// loopback, but its redirect to another loopback server is refused by the
// egress address rule, unless --egress-allow-cidr opens it; the target's
// body never reaches the message (issue 34, item 9).
func TestImagePullRedirectUnderEgressRule(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	layer := imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})
	ref := reg.Push(t, "test/redirect:1", imagestest.Image(t, v1.Config{}, layer))
	var hits atomic.Int64
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "INTERNAL-SECRET-PAGE")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(ln)
	t.Cleanup(func() { other.Close() })
	reg.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/"+digestOf(t, layer).String()) {
			http.Redirect(w, req, "http://"+ln.Addr().String()+"/blob", http.StatusTemporaryRedirect)
			return true
		}
		return false
	})

	src := imageSourceFor(t, "--image-allow", reg.Host+"/*")
	code, msg := resolveCode(t, src, ref)
	t.Logf("%s: %s", code, msg)
	if code != "image_pull_failed" || !strings.Contains(msg, "private address 127.0.0.1") || strings.Contains(msg, "INTERNAL-SECRET-PAGE") {
		t.Errorf("redirect to loopback: %s %q; want image_pull_failed refusing the private address", code, msg)
	}
	if hits.Load() != 0 {
		t.Errorf("the redirect target was reached %d times", hits.Load())
	}

	// The operator opens loopback: the redirect is followed, and the
	// target's answer shows as its status only.
	src = imageSourceFor(t, "--image-allow", reg.Host+"/*", "--egress-allow-cidr", "127.0.0.1/32")
	code, msg = resolveCode(t, src, ref)
	t.Logf("%s: %s", code, msg)
	if code != "image_pull_failed" || !strings.Contains(msg, "403") || strings.Contains(msg, "INTERNAL-SECRET-PAGE") {
		t.Errorf("redirect with loopback opened: %s %q; want the 403 without its body", code, msg)
	}
	if hits.Load() == 0 {
		t.Error("the redirect target was not reached with loopback opened")
	}

	// A registry the operator did not name (allowed by "*") is under the
	// rule itself.
	src = imageSourceFor(t, "--image-allow", "*")
	code, msg = resolveCode(t, src, ref)
	if code != "image_pull_failed" || !strings.Contains(msg, "private address 127.0.0.1") {
		t.Errorf("unnamed loopback registry: %s %q; want it refused", code, msg)
	}
}

// forwardProxy is an HTTP proxy on loopback: it forwards plain requests
// (CONNECT it refuses, so a client falls back to plain HTTP) and resolves
// names by names, not DNS; the hosts it was asked for are counted.
func forwardProxy(t *testing.T, names map[string]string) (string, func(host string) int64) {
	t.Helper()
	var mu sync.Mutex
	asked := map[string]int64{}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL.Host = names[r.In.URL.Host]
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		host := req.URL.Host
		if req.Method == http.MethodConnect {
			host = req.Host
		}
		mu.Lock()
		asked[host]++
		mu.Unlock()
		if req.Method == http.MethodConnect || names[host] == "" {
			http.Error(w, "INTERNAL-SECRET-PAGE", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func(host string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return asked[host]
	}
}

// Through an HTTP proxy of the environment, a registry's redirect is
// under the egress address rule too: the gateway does not hand the
// proxy a request for a private address (issue 34, item 9).
func TestImagePullRedirectThroughProxy(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	layer := imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})
	reg.Push(t, "test/proxied:1", imagestest.Image(t, v1.Config{}, layer))
	var redirect atomic.Bool
	reg.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
		if redirect.Load() && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/"+digestOf(t, layer).String()) {
			http.Redirect(w, req, "http://100.100.100.200/latest/meta-data/", http.StatusTemporaryRedirect)
			return true
		}
		return false
	})
	proxy, asked := forwardProxy(t, map[string]string{"registry.test": reg.Host})
	args := []string{"--image-allow", "registry.test/*", "--insecure-registry", "registry.test"}

	// The registry, named by the operator, is reached through the proxy.
	src := imageSourceProxied(t, proxy, args...)
	if _, err := src.Resolve(context.Background(), "registry.test/test/proxied:1"); err != nil {
		t.Fatalf("pull through the proxy: %v", err)
	}
	if asked("registry.test") == 0 {
		t.Fatal("the pull did not go through the proxy")
	}

	redirect.Store(true)
	src = imageSourceProxied(t, proxy, args...)
	code, msg := resolveCode(t, src, "registry.test/test/proxied:1")
	t.Logf("%s: %s", code, msg)
	if code != "image_pull_failed" || !strings.Contains(msg, "100.100.100.200") || strings.Contains(msg, "INTERNAL-SECRET-PAGE") {
		t.Errorf("redirect to a cloud metadata address (CGNAT): %s %q; want image_pull_failed refusing it", code, msg)
	}
	if n := asked("100.100.100.200"); n != 0 {
		t.Errorf("the proxy was asked for 100.100.100.200 %d times", n)
	}
}

// The bounds have their own API codes: image_too_large (--image-max-size),
// image_store_full (--image-store-max) and image_pull_timeout
// (--image-pull-timeout, --image-pull-stall-timeout).
func TestImagePullBoundCodes(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	big := reg.Push(t, "test/big:1", imagestest.Image(t, v1.Config{}, imagestest.RandomLayer(t, "r", 2<<20, 1)))
	silent := imagestest.SilentListener(t)
	for _, tc := range []struct {
		name, ref, code, want string
		args                  []string
	}{
		{"image too large", big, "image_too_large", "limit of the layer (1.0 MiB)", []string{"--image-max-size", "1MiB"}},
		{"store full", big, "image_store_full", "image store is full", []string{"--image-store-max", "1MiB"}},
		{"deadline", silent + "/test/silent:1", "image_pull_timeout", "took longer than 2s", []string{"--image-pull-timeout", "2s"}},
		{"stall", silent + "/test/silent:1", "image_pull_timeout", "sent nothing for 1s", []string{"--image-pull-stall-timeout", "1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, _, _ := strings.Cut(strings.TrimPrefix(tc.ref, "http://"), "/")
			src := imageSourceFor(t, append([]string{"--image-allow", host + "/*"}, tc.args...)...)
			code, msg := resolveCode(t, src, tc.ref)
			t.Logf("%s: %s", code, msg)
			if code != tc.code || !strings.Contains(msg, tc.want) {
				t.Errorf("got %s %q; want %s saying %q", code, msg, tc.code, tc.want)
			}
		})
	}
}

func digestOf(t *testing.T, x interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	d, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Through the built gateway: creates whose image is past a bound, or
// whose registry hangs or redirects to a private address, fail with their
// codes, and nothing of the image stays in the store.
func TestImageBoundsOverREST(t *testing.T) {
	requireLinuxDriver(t)
	reg := imagestest.NewRegistry(t)
	big := reg.Push(t, "tools/big:1", imagestest.Image(t, v1.Config{}, imagestest.RandomLayer(t, "r", 2<<20, 1)))
	small := imagestest.TarLayer(t, imagestest.Entry{Name: "f", Body: "x"})
	redirected := reg.Push(t, "tools/redirect:1", imagestest.Image(t, v1.Config{}, small))
	var hits atomic.Int64
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "INTERNAL-SECRET-PAGE")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(ln)
	t.Cleanup(func() { other.Close() })
	reg.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/"+digestOf(t, small).String()) {
			http.Redirect(w, req, "http://"+ln.Addr().String()+"/blob", http.StatusTemporaryRedirect)
			return true
		}
		return false
	})
	silent := imagestest.SilentListener(t)

	g := startGateway(t, "--sandbox", "linux", "--image-allow", reg.Host+"/tools/*", "--image-allow", silent+"/*",
		"--image-max-size", "1MiB", "--image-pull-timeout", "3s")
	for _, tc := range []struct {
		image  string
		status int
		code   string
	}{
		{big, http.StatusBadRequest, "image_too_large"},
		{silent + "/hangs:1", http.StatusBadGateway, "image_pull_timeout"},
		{redirected, http.StatusBadGateway, "image_pull_failed"},
	} {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		status := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"image": tc.image}, &e)
		t.Logf("%s: %d %s: %s", tc.image, status, e.Error.Code, e.Error.Message)
		if status != tc.status || e.Error.Code != tc.code {
			t.Errorf("create on %s: %d %s, want %d %s", tc.image, status, e.Error.Code, tc.status, tc.code)
		}
		if strings.Contains(e.Error.Message, "INTERNAL-SECRET-PAGE") {
			t.Errorf("create on %s: the redirect target's body is in the answer", tc.image)
		}
	}
	if hits.Load() != 0 {
		t.Errorf("the private redirect target was reached %d times", hits.Load())
	}
	for _, d := range []string{"layers/sha256", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(g.DataDir, "images", d))
		if err != nil || len(ents) != 0 {
			t.Errorf("images/%s after refused pulls: %v %v", d, ents, err)
		}
	}
}

// Each tenant has at most --image-pulls-per-tenant images being pulled on
// demand at once: one more is 429 too_many_image_pulls, while a create of
// an image it is pulling already waits for that pull, another tenant
// pulls as it likes, and the tenant may pull again once a pull is over.
func TestImagePullsPerTenant(t *testing.T) {
	silent := imagestest.SilentListener(t)
	src := imageSourceFor(t, "--image-allow", silent+"/*", "--image-pulls-per-tenant", "1", "--image-pull-timeout", "2s")
	as := func(tenant string) context.Context {
		return gateway.WithPrincipal(context.Background(), gateway.Principal{Tenant: tenant})
	}
	resolve := func(tenant, ref string) error {
		_, err := src.Resolve(as(tenant), silent+ref)
		return err
	}
	code := func(err error) string {
		var ge *gateway.Error
		if errors.As(err, &ge) {
			return ge.Code
		}
		return fmt.Sprint(err)
	}
	first := make(chan error, 2)
	go func() { first <- resolve("a", "/one:1") }()
	waitUntil(t, "a's pull under way", func() bool { return src.pulls.inFlight("a") == 1 })
	go func() { first <- resolve("a", "/one:1") }() // the same image: waits for it
	err := resolve("a", "/two:1")
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.Code != "too_many_image_pulls" || ge.Kind != gateway.KindQuota || ge.RetryAfter <= 0 ||
		!strings.Contains(ge.Message, "--image-pulls-per-tenant") {
		t.Fatalf("a second image of tenant a: %v, want 429 too_many_image_pulls naming the flag, with Retry-After", err)
	}
	if err := resolve("b", "/two:1"); code(err) != "image_pull_timeout" {
		t.Errorf("tenant b's pull: %s, want it pulled (here: the silent registry's image_pull_timeout)", code(err))
	}
	for range 2 {
		if err := <-first; code(err) != "image_pull_timeout" {
			t.Errorf("tenant a's pulls of one image: %s, want both to wait for the one pull", code(err))
		}
	}
	if n := src.pulls.inFlight("a"); n != 0 {
		t.Errorf("%d pulls still counted for a", n)
	}
	if err := resolve("a", "/two:1"); code(err) != "image_pull_timeout" {
		t.Errorf("tenant a's pull after its first ended: %s", code(err))
	}
}

// waitUntil polls ok for up to 10 s.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Hold holds the image a create resolved, by its digest: once its name
// was pulled again (another digest), a hold of the image resolved before
// (a warm pool's build, long after its pool started) is refused and
// leaves no reference, which would keep the new image's layers and not
// those the sandbox runs on.
func TestImageHoldByDigest(t *testing.T) {
	reg := imagestest.NewRegistry(t)
	ref := reg.Push(t, "tools/moving:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "a", Body: "1"})))
	src := imageSourceFor(t, "--image-allow", reg.Host+"/tools/*")
	old, err := src.Resolve(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	const id1, id2 = "sbx-aaaaaaaaaaaaaaaaaaaaaaaa", "sbx-bbbbbbbbbbbbbbbbbbbbbbbb"
	if err := src.Hold(id1, old); err != nil {
		t.Fatalf("hold of the image resolved: %v", err)
	}
	src.Release(id1)
	reg.Push(t, "tools/moving:1", imagestest.Image(t, v1.Config{}, imagestest.TarLayer(t, imagestest.Entry{Name: "a", Body: "2"})))
	if _, err := src.store.Pull(context.Background(), ref, images.PullOptions{InsecureRegistries: src.insecure}); err != nil {
		t.Fatal(err)
	}
	if err := src.Hold(id2, old); err == nil {
		t.Errorf("hold of %s's old digest %s after a pull of a new one: no error", ref, old.Digest)
	}
	if refs, err := src.store.Refs(); err != nil || len(refs) != 0 {
		t.Errorf("references after the refused hold: %v %v", refs, err)
	}
	cur, err := src.Resolve(context.Background(), ref)
	if err != nil || cur.Digest == old.Digest {
		t.Fatalf("resolve after the pull: %v %v", cur, err)
	}
	if err := src.Hold(id2, cur); err != nil {
		t.Errorf("hold of the image resolved now: %v", err)
	}
}
