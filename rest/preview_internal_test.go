package rest

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPreviewLabel(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	exp := time.Unix(1795933033, 0)
	for _, port := range []int{1, 80, 8000, 65535} {
		label, ok := signPreviewLabel(key, "alice", "sbx-abcdefghijklmnopqrst", port, exp)
		if !ok || len(label) > 63 || strings.ToLower(label) != label {
			t.Fatalf("label %q (%v): want one lowercase DNS label", label, ok)
		}
		l, ok := parsePreviewLabel(label)
		if !ok || l.port != port || l.session != "sbx-abcdefghijklmnopqrst" || l.expires != exp.Unix() {
			t.Fatalf("parse %q: %+v %v", label, l, ok)
		}
		if !l.verify(key, "alice") {
			t.Error("does not verify for its tenant")
		}
		if l.verify(key, "bob") || l.verify([]byte("another key, 32 bytes long......"), "alice") {
			t.Error("verifies for another tenant or key")
		}
	}
	if _, ok := signPreviewLabel(key, "alice", "not-a-session-id", 80, exp); ok {
		t.Error("a session id that cannot be a host name made a label")
	}
	good, _ := signPreviewLabel(key, "alice", "sbx-abcdefghijklmnopqrst", 8000, exp)
	for _, bad := range []string{
		"", "p", "p8000", "p8000-", "p08000" + good[5:], "p0" + good[5:], "p70000" + good[5:],
		strings.ToUpper(good), good + "a", good[:len(good)-1], strings.Replace(good, "-", "_", 1),
		"p8000-abcdefghijklmnopqrs1-" + good[len(good)-34:], // 1 is not base32
		"x8000" + good[5:],
	} {
		if _, ok := parsePreviewLabel(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzPreviewLabel(f *testing.F) {
	key := []byte("0123456789abcdef0123456789abcdef")
	good, _ := signPreviewLabel(key, "t", "sbx-abcdefghijklmnopqrst", 8000, time.Unix(1795933033, 0))
	f.Add(good)
	f.Add("p1-aaaaaaaaaaaaaaaaaaaa-" + strings.Repeat("a", 34))
	f.Add("p")
	f.Fuzz(func(t *testing.T, s string) {
		l, ok := parsePreviewLabel(s)
		if !ok {
			return
		}
		// One spelling: what parses is what signing would write.
		if again, _ := previewPayload(l.port, l.session, l.expires); again != l.signed || !strings.HasPrefix(s, again) || len(s) > 63 {
			t.Fatalf("%q parsed as %+v", s, l)
		}
	})
}

func TestPreviewHost(t *testing.T) {
	a := &api{}
	d := &api{cfg: Config{PreviewDomain: "preview.example.com"}}
	for _, c := range []struct {
		a     *api
		host  string
		label string
	}{
		{a, "p8000-x.localhost:8080", "p8000-x"},
		{a, "P8000-X.LOCALHOST.", "p8000-x"},
		{a, "p8000-x.localhost", "p8000-x"},
		{a, "localhost:8080", ""},
		{a, "127.0.0.1:8080", ""},
		{a, "api.localhost", ""},
		{a, "a.p8000-x.localhost", ""},
		{a, "p8000-x.preview.example.com", ""},
		{d, "p8000-x.preview.example.com:443", "p8000-x"},
		{d, "p8000-x.localhost", ""},
		{d, "p8000-x.evilpreview.example.com", ""},
	} {
		got, ok := c.a.previewHost(c.host)
		if got != c.label || ok != (c.label != "") {
			t.Errorf("previewHost(%q) under %q = %q %v, want %q", c.host, c.a.previewDomain(), got, ok, c.label)
		}
	}
}

func TestHostOnlyCookies(t *testing.T) {
	got := hostOnlyCookies([]string{
		"a=1; Domain=localhost; Path=/",
		"b=2;domain=.example.com;Secure",
		"c=3; Path=/; HttpOnly",
		"d=Domain=x; DOMAIN = y ; SameSite=Lax",
	})
	want := []string{"a=1; Path=/", "b=2;Secure", "c=3; Path=/; HttpOnly", "d=Domain=x; SameSite=Lax"}
	if !slices.Equal(got, want) {
		t.Errorf("hostOnlyCookies = %q, want %q", got, want)
	}
}

// TestBaseURLIgnoresHost: without a public URL, the base of links is the
// address the connection reached, whatever the Host header says; with
// one, the public URL.
func TestBaseURLIgnoresHost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := &api{cfg: Config{PublicURL: r.URL.Query().Get("public")}}
		_, _ = w.Write([]byte(a.baseURL(r)))
	}))
	t.Cleanup(srv.Close)
	get := func(q string) string {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+q, nil)
		req.Host = "evil.example:666"
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b := make([]byte, 256)
		n, _ := res.Body.Read(b)
		return string(b[:n])
	}
	if got := get("/"); got != srv.URL {
		t.Errorf("base %q, want the listener's %q", got, srv.URL)
	}
	if got := get("/?public=https://sandgate.example.com/"); got != "https://sandgate.example.com" {
		t.Errorf("base %q, want the public URL", got)
	}
}

func TestCheckFlags(t *testing.T) {
	for _, u := range []string{"http://localhost:8080", "https://sandgate.example.com", "https://x.example.com/base/"} {
		if err := CheckPublicURL(u); err != nil {
			t.Errorf("%q: %v", u, err)
		}
	}
	for _, u := range []string{"", "localhost:8080", "ftp://x", "https://", "https://u:p@x", "https://x/?q", "https://x/#f"} {
		if err := CheckPublicURL(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	for _, d := range []string{"localhost", "preview.example.com", "p-1.example"} {
		if err := CheckPreviewDomain(d); err != nil {
			t.Errorf("%q: %v", d, err)
		}
	}
	for _, d := range []string{"", ".example.com", "example.com.", "a..b", "-a.com", "a_b.com", "10.0.0.1", strings.Repeat("a", 64) + ".com"} {
		if err := CheckPreviewDomain(d); err == nil {
			t.Errorf("%q accepted", d)
		}
	}
}

// TestPreviewLocation: a redirect of the server's own origin stays on the
// preview's, never becoming a "//host" URL that leaves it, and one to
// the preview's label keeps the issued URL's scheme and port.
func TestPreviewLocation(t *testing.T) {
	a := &api{}
	label := "p8000-x"
	origin := &portTarget{port: 8000, route: portRoute{label: label, scheme: "http", port: "8080"}}
	prefixed := &portTarget{port: 8000, route: portRoute{public: "/v1/sessions/s/ports/8000", fwdPrefix: "/v1/sessions/s/ports/8000"}}
	for _, c := range []struct {
		t    *portTarget
		loc  string
		want string // "": refused
	}{
		{origin, "/a?b#c", "/a?b#c"},
		{origin, "http://localhost:8000/a", "/a"},
		{origin, "http://localhost:8000//evil.example/x", ""},
		{origin, "http://127.0.0.1:8000//evil.example", ""},
		{origin, "//evil.example/x", ""},
		{origin, "/\\evil.example", ""},
		{origin, "http://p8000-x.localhost:8080/a", "http://p8000-x.localhost:8080/a"},
		{origin, "http://p8000-x.localhost:6379/", ""},
		{origin, "http://p8000-x.localhost/", ""},
		{origin, "https://p8000-x.localhost:8080/", ""},
		{origin, "http://p8000-y.localhost:8080/", ""},
		{prefixed, "http://localhost:8000//x", "/v1/sessions/s/ports/8000//x"},
	} {
		got, ok := a.previewLocation(c.loc, c.t)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("previewLocation(%q) on %q = %q %v, want %q", c.loc, c.t.route.label, got, ok, c.want)
		}
	}
}

// TestPreviewDomainCase: a --preview-domain spelled with capitals still
// matches the (lowercased) Host, for the gateway and the cluster's front.
func TestPreviewDomainCase(t *testing.T) {
	a := &api{cfg: Config{PreviewDomain: "Preview.Example.COM"}}
	if l, ok := a.previewHost("p8000-x.preview.example.com:443"); !ok || l != "p8000-x" {
		t.Errorf("previewHost = %q %v under a domain with capitals", l, ok)
	}
	key := []byte("0123456789abcdef0123456789abcdef")
	label, _ := signPreviewLabel(key, "alice", "sbx-abcdefghijklmnopqrst", 8000, time.Unix(1795933033, 0))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Host = label + ".PREVIEW.example.com"
	if id, ok := PreviewSession("Preview.Example.COM")(r); !ok || id != "sbx-abcdefghijklmnopqrst" {
		t.Errorf("PreviewSession = %q %v under a domain with capitals", id, ok)
	}
}
