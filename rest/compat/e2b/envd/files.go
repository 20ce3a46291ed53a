package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/rest"
)

// envd's HTTP file endpoints: GET /files?path=P downloads a file, POST
// /files?path=P uploads one (the body as application/octet-stream, which
// newer SDKs send) or several (multipart/form-data, each part's filename
// its path). The username parameter is accepted and not used: every file
// is the sandbox user's, as over SFTP.

const (
	// maxUploadParts bounds the files of one multipart upload.
	maxUploadParts = 1000
	// maxSizelessRead bounds a download of a file whose size reads as 0
	// (/proc), as /v1's GET /files does.
	maxSizelessRead = 64 << 20
	// metadataHeader starts the headers of E2B's file metadata (extended
	// attributes), which SFTP cannot set.
	metadataHeader = "X-Metadata-"
)

// writeInfo is what an upload answers of each file.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// dirPath is the error of an upload to p, which names a directory.
func dirPath(p string) error {
	return invalid("invalid_path", p+": names a directory; give the file's name")
}

// filePath is the path parameter of a /files call.
func filePath(r *http.Request, required bool) (string, bool, error) {
	raw := r.URL.Query().Get("path")
	if raw == "" && !required {
		return "", false, nil
	}
	p, err := checkPath(raw)
	if err != nil {
		return "", false, err
	}
	return p, true, nil
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	p, _, err := filePath(r, true)
	if err != nil {
		s.writeFailure(w, r, err, "read file")
		return
	}
	fsys, err := s.d.Plane.Files.Open(r.Context(), c.sess.ID, c.sess.Tenant, c.sess, true)
	if err != nil {
		s.writeFailure(w, r, err, "read file")
		return
	}
	defer fsys.Close()
	f, e, err := fsys.Open(p)
	if err != nil {
		s.writeFailure(w, r, err, "read file")
		return
	}
	defer f.Close()
	c.sess.Audit(r.Context(), audit.Event{Kind: audit.KindFile, Source: "rest", Op: "read", Path: p, Bytes: e.SizeBytes, Result: "ok"})
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": e.Name}))
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "sandbox")
	if e.SizeBytes == 0 {
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, io.LimitReader(f, maxSizelessRead))
		return
	}
	http.ServeContent(w, r, "", e.Mtime, f)
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	for name := range r.Header {
		if strings.HasPrefix(name, metadataHeader) {
			writeHTTPError(w, http.StatusBadRequest, "metadata_unsupported", "file metadata (extended attributes) is not supported by this sandbox")
			return
		}
	}
	if max := s.d.Plane.Bounds.MaxFileBytes; max > 0 && r.ContentLength > max {
		writeHTTPError(w, http.StatusRequestEntityTooLarge, "file_too_large",
			fmt.Sprintf("%d bytes is over the limit of %d bytes a file", r.ContentLength, max))
		return
	}
	qpath, hasPath, err := filePath(r, false)
	if err == nil && strings.HasSuffix(r.URL.Query().Get("path"), "/") {
		err = dirPath(r.URL.Query().Get("path"))
	}
	if err != nil {
		s.writeFailure(w, r, err, "write file")
		return
	}
	mt, mtParams, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	isMultipart := mt == "multipart/form-data"
	if !isMultipart && !hasPath {
		writeHTTPError(w, http.StatusBadRequest, "invalid_path", "path is required")
		return
	}
	fsys, err := s.d.Plane.Files.Open(r.Context(), c.sess.ID, c.sess.Tenant, c.sess, true)
	if err != nil {
		s.writeFailure(w, r, err, "write file")
		return
	}
	defer fsys.Close()
	body := rest.NewStallReader(w, r, s.d.Plane.Bounds.UploadStall)
	defer body.Done()
	write := func(p string, src io.Reader) (writeInfo, error) {
		if p == "." || p == "/" {
			return writeInfo{}, dirPath(p)
		}
		e, _, err := fsys.Write(p, src, dataplane.WriteOptions{Mkdirs: true, MaxBytes: s.d.Plane.Bounds.MaxFileBytes})
		if err != nil {
			return writeInfo{}, err
		}
		c.sess.Audit(r.Context(), audit.Event{Kind: audit.KindFile, Source: "rest", Op: "write", Path: p, Bytes: e.SizeBytes, Result: "ok"})
		return writeInfo{Name: e.Name, Type: "file", Path: p}, nil
	}
	var out []writeInfo
	fail := func(err error) {
		if body.Stalled() {
			w.Header().Set("Connection", "close")
			writeHTTPError(w, http.StatusRequestTimeout, "upload_stalled",
				fmt.Sprintf("no byte of the upload came for %s; the file was not written", s.d.Plane.Bounds.UploadStall))
			return
		}
		s.writeFailure(w, r, err, "write file")
	}
	if !isMultipart {
		var src io.Reader = body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(body)
			if err != nil {
				writeHTTPError(w, http.StatusBadRequest, "invalid_body", "the body is not gzip: "+err.Error())
				return
			}
			defer zr.Close()
			src = zr
		}
		wi, err := write(qpath, src)
		if err != nil {
			fail(err)
			return
		}
		out = append(out, wi)
	} else {
		boundary := mtParams["boundary"]
		if boundary == "" {
			writeHTTPError(w, http.StatusBadRequest, "invalid_body", "the multipart body has no boundary")
			return
		}
		mr := multipart.NewReader(body, boundary)
		for i := 0; ; i++ {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				if body.Stalled() {
					fail(err)
					return
				}
				writeHTTPError(w, http.StatusBadRequest, "invalid_body", "the multipart body cannot be read: "+err.Error())
				return
			}
			if i == maxUploadParts {
				writeHTTPError(w, http.StatusBadRequest, "too_many_files", fmt.Sprintf("an upload holds at most %d files", maxUploadParts))
				return
			}
			p := qpath
			if !hasPath || i > 0 {
				// FileName would keep only the base name: the SDKs send
				// the whole path as the filename.
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p, err = checkPath(params["filename"])
				if err == nil && strings.HasSuffix(params["filename"], "/") {
					err = dirPath(params["filename"])
				}
				if err != nil {
					s.writeFailure(w, r, err, "write file")
					return
				}
			}
			wi, err := write(p, part)
			if err != nil {
				fail(err)
				return
			}
			out = append(out, wi)
		}
		if len(out) == 0 {
			writeHTTPError(w, http.StatusBadRequest, "invalid_body", "the upload holds no file")
			return
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
