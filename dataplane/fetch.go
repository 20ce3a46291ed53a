package dataplane

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Limits of files/fetch.
const (
	MaxFetchURLs       = 200
	maxFetchURLBytes   = 8192
	maxFetchRedirects  = 10
	maxFetchNameBytes  = 255
	defaultFetchWorker = 4
	defaultFetchTime   = 10 * time.Minute
)

// Fetch statuses.
const (
	FetchSuccess        = "success"
	FetchPartialSuccess = "partial_success"
	FetchFailure        = "failure"
)

// Fetcher downloads URLs in the gateway and writes them into a sandbox.
// Every connection, redirects' included, is dialled by Dial (the egress
// proxy's DialPublic: public addresses only), never through a proxy.
type Fetcher struct {
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxBytes caps each download; a larger one fails and leaves nothing.
	MaxBytes int64
	// Concurrency is how many downloads run at once (default 4).
	Concurrency int
	// Timeout bounds each download, body included (default 10 min).
	Timeout time.Duration
	// Name, when set, names a download from its URL as asked (a seed's
	// "Content-Disposition" query parameter); its answer, reduced to a
	// base name, comes before the response's Content-Disposition, and ""
	// defers to it.
	Name func(u *url.URL) string
	// Overwrite replaces a file already at a download's name. Without it
	// nothing is ever replaced: the download takes the next free name
	// ("a-1.txt"), as for duplicates within one fetch.
	Overwrite bool
}

// FetchResult is files/fetch's answer.
type FetchResult struct {
	Status  string       `json:"status"`
	Fetched []string     `json:"fetched"`
	Errors  []FetchError `json:"errors"`
}

// FetchError is one URL that could not be fetched.
type FetchError struct {
	URL   string `json:"url"`
	Error string `json:"error"`
}

// CheckFetch validates a fetch request: 1 to MaxFetchURLs absolute http or
// https URLs. The error is an *Error of KindInvalid naming the bad URLs.
func CheckFetch(urls []string) error {
	if len(urls) == 0 || len(urls) > MaxFetchURLs {
		return fileErr(KindInvalid, nil, "urls must hold 1 to %d URLs, got %d", MaxFetchURLs, len(urls))
	}
	var bad []string
	for i, raw := range urls {
		if err := checkURL(raw); err != nil {
			bad = append(bad, fmt.Sprintf("urls[%d]: %v", i, err))
		}
	}
	if len(bad) > 0 {
		if len(bad) > 5 {
			bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
		}
		return fileErr(KindInvalid, nil, "%s", strings.Join(bad, "; "))
	}
	return nil
}

func checkURL(raw string) error {
	if len(raw) > maxFetchURLBytes {
		return fmt.Errorf("longer than %d bytes", maxFetchURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q: only http and https are fetched", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	return nil
}

// Fetch downloads urls (checked with CheckFetch) into destDir of fsys,
// creating it. Each file is named after its Content-Disposition filename,
// else the URL path's last segment, else "download", reduced to a base
// name and made unique within the request ("a.txt", "a-1.txt") and,
// unless Overwrite, among the files already in destDir. A name the remote
// server chose (its Content-Disposition, or the path it redirected to)
// never starts with a dot: ".bashrc" becomes "bashrc". Each file is
// written atomically, so a failed download leaves nothing. The error is
// for destDir only; each URL's failure is in the result.
func (fe *Fetcher) Fetch(ctx context.Context, fsys *FS, urls []string, destDir string) (FetchResult, error) {
	if err := fsys.Mkdirs(destDir); err != nil {
		return FetchResult{}, err
	}
	workers := fe.Concurrency
	if workers <= 0 {
		workers = defaultFetchWorker
	}
	timeout := fe.Timeout
	if timeout <= 0 {
		timeout = defaultFetchTime
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           fe.Dial,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost:   workers,
		IdleConnTimeout:       30 * time.Second,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > maxFetchRedirects {
				return fmt.Errorf("more than %d redirects", maxFetchRedirects)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to scheme %q refused", req.URL.Scheme)
			}
			return nil
		},
	}

	n := &namer{used: map[string]bool{}}
	fetched := make([]string, len(urls))
	errs := make([]string, len(urls))
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p, err := fe.fetchOne(ctx, client, fsys, u, destDir, n)
			if err != nil {
				errs[i] = err.Error()
				return
			}
			fetched[i] = p
		}()
	}
	wg.Wait()

	res := FetchResult{Fetched: []string{}, Errors: []FetchError{}}
	for i, u := range urls {
		if errs[i] != "" {
			res.Errors = append(res.Errors, FetchError{URL: u, Error: errs[i]})
		} else {
			res.Fetched = append(res.Fetched, fetched[i])
		}
	}
	switch {
	case len(res.Errors) == 0:
		res.Status = FetchSuccess
	case len(res.Fetched) == 0:
		res.Status = FetchFailure
	default:
		res.Status = FetchPartialSuccess
	}
	return res, nil
}

func (fe *Fetcher) fetchOne(ctx context.Context, client *http.Client, fsys *FS, raw, destDir string, n *namer) (string, error) {
	if err := checkURL(raw); err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return "", errors.New("not a URL")
	}
	req.Header.Set("User-Agent", "sandgate-fetch")
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("HTTP %s", resp.Status)
	}
	if fe.MaxBytes > 0 && resp.ContentLength > fe.MaxBytes {
		return "", fmt.Errorf("%d bytes is over the limit of %d bytes", resp.ContentLength, fe.MaxBytes)
	}
	name := ""
	if fe.Name != nil {
		name = sanitizeName(fe.Name(req.URL))
	}
	if name == "" {
		var serverChose bool
		name, serverChose = fileName(resp.Header.Get("Content-Disposition"), req.URL, resp.Request.URL)
		if serverChose {
			name = undotted(name)
		}
	}
	p := path.Join(destDir, n.claim(name))
	o := WriteOptions{MaxBytes: fe.MaxBytes}
	if !fe.Overwrite {
		o.NoReplace = true
		o.Rename = func() string { return path.Join(destDir, n.claim(name)) }
	}
	e, _, err := fsys.Write(p, resp.Body, o)
	if err != nil {
		var fe2 *Error
		if errors.As(err, &fe2) {
			switch fe2.Kind {
			case KindTooLarge:
				return "", fmt.Errorf("over the limit of %d bytes", fe.MaxBytes)
			case KindAborted:
				return "", fmt.Errorf("download failed: %v", fe2.Err)
			}
			return "", errors.New(fe2.Msg)
		}
		return "", err
	}
	return e.Path, nil
}

// fileName picks a download's name: the Content-Disposition filename, else
// the last segment of the final URL's path (asked is the URL asked for),
// else "download". serverChose says the remote server picked it: a
// Content-Disposition, or a redirect to another path.
func fileName(disposition string, asked, final *url.URL) (name string, serverChose bool) {
	if disposition != "" {
		if _, params, err := mime.ParseMediaType(disposition); err == nil {
			if s := sanitizeName(params["filename"]); s != "" {
				return s, true
			}
		}
	}
	if final != nil {
		last := final.Path[strings.LastIndex(final.Path, "/")+1:] // "" for "/dir/"
		if s := sanitizeName(last); s != "" {
			return s, asked == nil || asked.Path != final.Path
		}
	}
	return "download", false
}

// undotted is a server-chosen name without its leading dots, which would
// make it a hidden file (".bashrc", ".profile": run by the next shell);
// "download" when nothing else is left.
func undotted(name string) string {
	name = strings.TrimLeft(name, ".")
	if name == "" {
		return "download"
	}
	return name
}

// sanitizeName reduces s to a safe base name: the part after the last / or
// \, without control characters, not "." or "..", at most 255 bytes; ""
// when nothing is left.
func sanitizeName(s string) string {
	if i := strings.LastIndexAny(s, `/\`); i >= 0 {
		s = s[i+1:]
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return -1
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	for len(s) > maxFetchNameBytes {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	if s == "." || s == ".." || strings.HasPrefix(s, tempPrefix) {
		return ""
	}
	return s
}

// namer hands out names unique within one fetch.
type namer struct {
	mu   sync.Mutex
	used map[string]bool
}

func (n *namer) claim(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	cand := name
	ext := path.Ext(name)
	stem := strings.TrimSuffix(name, ext)
	if stem == "" || len(ext) > 32 { // ".bashrc", or no real extension
		stem, ext = name, ""
	}
	for i := 1; n.used[cand]; i++ {
		suffix := "-" + strconv.Itoa(i)
		s := stem
		for len(s)+len(suffix)+len(ext) > maxFetchNameBytes {
			_, size := utf8.DecodeLastRuneInString(s)
			s = s[:len(s)-size]
		}
		cand = s + suffix + ext
	}
	n.used[cand] = true
	return cand
}
