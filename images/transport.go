package images

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// guardTransport is a pull's transport around the store's. It bounds every
// answer but blobs (manifests, indexes, tokens) at maxManifestBytes, and
// fails a request when its server sends nothing for stall: no response
// headers, or no body bytes while the puller waits for some. It is a
// RoundTripper, so it sees redirected requests too.
type guardTransport struct {
	rt    http.RoundTripper
	stall time.Duration // <= 0: none
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	stalled := fmt.Errorf("%w: %s sent nothing for %s", ErrPullTimeout, req.URL.Host, g.stall)
	var timer *time.Timer
	if g.stall > 0 {
		timer = time.AfterFunc(g.stall, func() { cancel(stalled) })
	}
	resp, err := g.rt.RoundTrip(req.WithContext(ctx))
	if timer != nil {
		timer.Stop()
	}
	if err != nil {
		cause := context.Cause(ctx)
		cancel(nil)
		if cause == stalled {
			return nil, stalled
		}
		return nil, err
	}
	b := &guardBody{rc: resp.Body, cancel: cancel, ctx: ctx, stall: g.stall, timer: timer, stalled: stalled}
	if resp.StatusCode == http.StatusOK && !isBlob(req) {
		what := "an answer of " + req.URL.Host
		if isManifest(req) {
			what = "the manifest or index"
		}
		b.tooLarge = fmt.Errorf("%w: %s is larger than its limit of %s", ErrTooLarge, what, fmtBytes(maxManifestBytes))
		if resp.ContentLength > maxManifestBytes {
			b.Close()
			return nil, b.tooLarge
		}
		b.left = maxManifestBytes
	}
	resp.Body = b
	return resp, nil
}

// origin is the request that a chain of redirects started from.
func origin(req *http.Request) *http.Request {
	for i := 0; i < 20 && req.Response != nil && req.Response.Request != nil; i++ {
		req = req.Response.Request
	}
	return req
}

// isBlob: the chain started at /v2/<name>/blobs/<digest>. The path's
// last segments decide, as a repository's name may hold "/blobs/" too
// (the manifest of x/blobs/y is no blob).
func isBlob(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	kind, ref := lastSegments(origin(req).URL.Path)
	return kind == "blobs" && blobDigest.MatchString(ref)
}

// isManifest: the chain started at /v2/<name>/manifests/<reference>.
func isManifest(req *http.Request) bool {
	kind, ref := lastSegments(origin(req).URL.Path)
	return kind == "manifests" && ref != ""
}

// blobDigest is a digest as a blob's path ends in: <algorithm>:<encoded>.
var blobDigest = regexp.MustCompile(`^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)

// lastSegments is p's next-to-last and last segments.
func lastSegments(p string) (kind, ref string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", ""
	}
	j := strings.LastIndexByte(p[:i], '/')
	return p[j+1 : i], p[i+1:]
}

// guardBody is a response body under guardTransport: a read waits at most
// stall, and a bounded body fails past its bound without reading more.
type guardBody struct {
	rc       io.ReadCloser
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stall    time.Duration
	timer    *time.Timer
	stalled  error
	tooLarge error // nil: unbounded
	left     int64
}

func (b *guardBody) Read(p []byte) (int, error) {
	if b.tooLarge != nil {
		if b.left < 0 {
			return 0, b.tooLarge
		}
		if int64(len(p)) > b.left+1 {
			p = p[:b.left+1]
		}
	}
	if b.timer != nil {
		b.timer.Reset(b.stall)
	}
	n, err := b.rc.Read(p)
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.tooLarge != nil {
		b.left -= int64(n)
		if b.left < 0 {
			return n, b.tooLarge
		}
	}
	if err != nil && err != io.EOF && context.Cause(b.ctx) == b.stalled {
		err = b.stalled
	}
	return n, err
}

func (b *guardBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	err := b.rc.Close()
	b.cancel(nil)
	return err
}

// errFromElsewhere is what a tenant sees of an error answer that came from
// a server other than the registry (a redirect's target, a token server):
// its status, never its body.
func errFromElsewhere(host string) error {
	return fmt.Errorf("the answer came from %s, not the registry (its body is not shown)", host)
}
