package rest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// The files part of the data plane: every operation goes through an SFTP
// server started in the session's sandbox for the request (see
// dataplane/files.go), so paths resolve as the sandbox sees them.

// WriteDataError answers the failure of a file operation on the session
// of r's {id}, found through sessions; log gets what the client is not
// told. The compat APIs answer theirs with it too.
func WriteDataError(w http.ResponseWriter, r *http.Request, sessions Sessions, log *slog.Logger, err error) {
	// A pause under the call closed the SFTP connection it used (or the
	// sandbox refused a start, being paused): say that, not 500 nor 503.
	if gateway.PausedCause(pauseContext(r)) || errors.Is(err, sandbox.ErrPaused) {
		WriteGatewayError(w, gateway.ErrPaused)
		return
	}
	var fe *dataplane.Error
	if ge, ok := gateway.AsError(err); ok && errors.As(err, &fe) {
		if fe.Kind == dataplane.KindUnavailable {
			log.WarnContext(r.Context(), "files_unavailable", "path", r.URL.Path, "err", err)
		}
		WriteGatewayError(w, ge)
		return
	}
	// A session that ended under the call (deleted, expired, stopped)
	// took its SFTP connection with it: say that, not 500.
	if id := chi.URLParam(r, "id"); id != "" {
		s, gerr := sessions.Get(r.Context(), principal(r), id)
		switch {
		case gerr != nil:
			WriteGatewayError(w, gerr)
			return
		case !s.Live():
			WriteError(w, http.StatusConflict, "session_not_running", "the session stopped during the call")
			return
		case s.Status() == gateway.StatusPaused:
			WriteGatewayError(w, gateway.ErrPaused)
			return
		}
	}
	log.ErrorContext(r.Context(), "file_operation_failed", "method", r.Method, "path", r.URL.Path, "err", err)
	WriteError(w, http.StatusInternalServerError, "internal", "internal error")
}

// boolParam reads an optional boolean query parameter.
func boolParam(w http.ResponseWriter, r *http.Request, name string) (bool, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, true
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("%s must be true or false, got %q", name, v))
		return false, false
	}
	return b, true
}

// pathParam reads the required path query parameter.
func (a *api) pathParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	p, err := dataplane.CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return "", false
	}
	return p, true
}

// openFS is the session's SFTP server for one request (shared by the
// session's requests, started outside the command history if needed).
func (a *api) openFS(w http.ResponseWriter, r *http.Request, s *gateway.Session) (*dataplane.FS, bool) {
	return a.openFiles(w, r, s, false)
}

// openStream is openFS for a transfer (a download or an upload), which
// counts against the bounds on transfers at once: 503
// too_many_file_transfers past them.
func (a *api) openStream(w http.ResponseWriter, r *http.Request, s *gateway.Session) (*dataplane.FS, bool) {
	return a.openFiles(w, r, s, true)
}

// openLinkStream is openStream for a presigned link's fetch, which may
// hold at most half of the session's transfers.
func (a *api) openLinkStream(w http.ResponseWriter, r *http.Request, s *gateway.Session) (*dataplane.FS, bool) {
	fsys, err := a.dp.Files.OpenLink(r.Context(), s.ID, s.Tenant, s)
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return nil, false
	}
	return fsys, true
}

func (a *api) openFiles(w http.ResponseWriter, r *http.Request, s *gateway.Session, stream bool) (*dataplane.FS, bool) {
	fsys, err := a.dp.Files.Open(r.Context(), s.ID, s.Tenant, s, stream)
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return nil, false
	}
	return fsys, true
}

// sweepUploads removes the temporary files of uploads that an earlier run
// of the gateway left when it died mid-PUT (dataplane.Files journals them),
// in the sessions it re-adopted.
func (a *api) sweepUploads(stale []dataplane.StaleUpload) {
	owners, ok := a.cfg.Sessions.(SessionOwners)
	if !ok {
		return
	}
	ctx := context.Background()
	n := a.dp.Files.SweepUploads(ctx, stale, func(id string) (dataplane.Session, string, bool, bool) {
		tenant, known := owners.Owner(id)
		if !known {
			return nil, "", false, false
		}
		s, err := a.cfg.Sessions.Get(ctx, gateway.Principal{Tenant: tenant}, id)
		if errors.Is(err, gateway.ErrNotFound) {
			return nil, "", false, false
		}
		if err != nil {
			return nil, "", false, true
		}
		// A paused one's SFTP server cannot start: its entries wait for
		// the next start (the sweep must not resume it).
		return s, tenant, s.Live() && s.Status() != gateway.StatusPaused, true
	})
	a.cfg.Log.Info("stale_uploads_removed", "journaled", len(stale), "removed", n)
}

// getFile serves GET /v1/sessions/{id}/files?path=P: the file's bytes
// (Range, If-Modified-Since...), or with list=true the directory's entries.
func (a *api) getFile(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	list, ok := boolParam(w, r, "list")
	if !ok {
		return
	}
	recursive, ok := boolParam(w, r, "recursive")
	if !ok {
		return
	}
	fsys, ok := a.openFiles(w, r, s, !list)
	if !ok {
		return
	}
	defer fsys.Close()
	if list {
		auditFile(r, "list", p, 0)
		entries, truncated, err := fsys.List(p, recursive, 0)
		if err != nil {
			WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
			return
		}
		_ = WriteJSON(w, http.StatusOK, map[string]any{"entries": entries, "truncated": truncated})
		return
	}
	auditFile(r, "read", p, -1)
	sandboxed(w)
	a.serveFile(w, r, fsys, p)
}

// serveFile streams the regular file p of fsys (Range, If-Modified-Since...):
// GET /files and presigned links (links.go) alike.
func (a *api) serveFile(w http.ResponseWriter, r *http.Request, fsys *dataplane.FS, p string) {
	f, e, err := fsys.Open(p)
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	defer f.Close()
	sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
	// The deadline stays on a kept-alive connection: clear it for the next.
	defer func() { _ = sw.rc.SetWriteDeadline(time.Time{}) }()
	w = sw
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	if e.SizeBytes == 0 {
		// Empty, or a file whose size the kernel does not know before it
		// is read (/proc, /sys): send what reading gives, without a
		// length (so no ranges), up to maxSizelessRead.
		w.Header().Set("Last-Modified", e.Mtime.UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = io.Copy(w, io.LimitReader(f, maxSizelessRead))
		}
		return
	}
	http.ServeContent(w, r, "", e.Mtime, f)
}

// maxSizelessRead bounds what a GET of a file whose size reads as 0 sends.
const maxSizelessRead = 64 << 20

// downloadStall ends a download whose client takes nothing for this long:
// it holds one of the bounded transfers (dataplane.Files) until then.
const downloadStall = time.Minute

// stallWriter is a download's writer: each write must be taken by the
// client within downloadStall.
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (w *stallWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(downloadStall))
	return w.ResponseWriter.Write(p)
}

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// StallReader is an upload's body: each read must get a byte within
// its stall time (dataplane.Bounds.UploadStall), or the upload ends,
// freeing the transfer it holds (dataplane.Files). The seeds' file
// uploads (rest/compat) read theirs through it too.
type StallReader struct {
	r       io.Reader
	rc      *http.ResponseController
	stall   time.Duration
	stalled bool
}

// NewStallReader is r's body for the answer w, each read given stall.
func NewStallReader(w http.ResponseWriter, r *http.Request, stall time.Duration) *StallReader {
	return &StallReader{r: r.Body, rc: http.NewResponseController(w), stall: stall}
}

func (b *StallReader) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.stall))
	n, err := b.r.Read(p)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		b.stalled = true
	}
	return n, err
}

// Stalled reports whether a read ended because the client sent nothing
// for the stall time (the body must not be read again).
func (b *StallReader) Stalled() bool { return b.stalled }

// Done clears the read deadline the reads set, unless the body stalled
// (a stalled body is not read again): call it when the upload ends.
func (b *StallReader) Done() {
	if !b.stalled {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

// putFile serves PUT /v1/sessions/{id}/files?path=P: the body becomes the
// file, atomically.
func (a *api) putFile(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	if strings.HasSuffix(r.URL.Query().Get("path"), "/") {
		// A final slash names a directory: never write a file there.
		WriteError(w, http.StatusBadRequest, "invalid_path", "path names a directory (it ends with /); give the file's name")
		return
	}
	mkdirs, ok := boolParam(w, r, "mkdirs")
	if !ok {
		return
	}
	opts := dataplane.WriteOptions{Mkdirs: mkdirs, MaxBytes: a.dp.Bounds.MaxFileBytes}
	if v := r.URL.Query().Get("mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o777 {
			WriteError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("mode must be octal permission bits from 0000 to 0777, got %q", v))
			return
		}
		mode := fs.FileMode(m)
		opts.Mode = &mode
	}
	if max := a.dp.Bounds.MaxFileBytes; max > 0 && r.ContentLength > max {
		WriteError(w, http.StatusRequestEntityTooLarge, "file_too_large",
			fmt.Sprintf("%s: %d bytes is over the limit of %d bytes", p, r.ContentLength, max))
		return
	}
	fsys, ok := a.openStream(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	a.auditFileStarted(r, "write", p)
	body := NewStallReader(w, r, a.dp.Bounds.UploadStall)
	defer body.Done()
	e, created, err := fsys.Write(p, body, opts)
	if err == nil {
		auditFile(r, "write", p, e.SizeBytes)
	}
	if err != nil && body.Stalled() {
		// Closed after the answer: the server would otherwise read the
		// rest of a short body before answering.
		w.Header().Set("Connection", "close")
		WriteError(w, http.StatusRequestTimeout, "upload_stalled",
			fmt.Sprintf("%s: no byte of the upload came for %s; nothing was written", p, a.dp.Bounds.UploadStall))
		return
	}
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	_ = WriteJSON(w, status, e)
}

// deleteFile serves DELETE /v1/sessions/{id}/files?path=P.
func (a *api) deleteFile(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	p, ok := a.pathParam(w, r)
	if !ok {
		return
	}
	recursive, ok := boolParam(w, r, "recursive")
	if !ok {
		return
	}
	fsys, ok := a.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	auditFile(r, "remove", p, 0)
	if err := fsys.Remove(p, recursive); err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fetchRequest is the body of POST /v1/sessions/{id}/files/fetch.
type fetchRequest struct {
	URLs    []string `json:"urls"`
	DestDir *string  `json:"destDir"`
	// Overwrite replaces files already there; without it a download takes
	// the next free name.
	Overwrite bool `json:"overwrite"`
}

// fetchFiles serves POST /v1/sessions/{id}/files/fetch: the gateway
// downloads each URL (public addresses only) into the sandbox.
func (a *api) fetchFiles(w http.ResponseWriter, r *http.Request) {
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	if a.dp.Bounds.DialPublic == nil {
		WriteError(w, http.StatusServiceUnavailable, "fetch_unavailable", "this gateway does not fetch URLs (it has no egress proxy)")
		return
	}
	var req fetchRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	if err := dataplane.CheckFetch(req.URLs); err != nil {
		var fe *dataplane.Error
		if errors.As(err, &fe) {
			WriteError(w, http.StatusBadRequest, "invalid_url", fe.Msg)
			return
		}
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	dest := "."
	if req.DestDir != nil && *req.DestDir != "" {
		d, err := dataplane.CheckPath(*req.DestDir)
		if err != nil {
			WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
			return
		}
		dest = d
	}
	fsys, ok := a.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	a.auditFileStarted(r, "fetch", dest)
	fe := &dataplane.Fetcher{Dial: a.dp.Bounds.DialPublic, MaxBytes: a.dp.Bounds.MaxFetchBytes, Overwrite: req.Overwrite}
	res, err := fe.Fetch(r.Context(), fsys, req.URLs, dest)
	if err != nil {
		WriteDataError(w, r, a.cfg.Sessions, a.cfg.Log, err)
		return
	}
	_ = WriteJSON(w, http.StatusOK, res)
}
