package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client is a small client of the gateway's /v1 REST API: only what the
// MCP tools need. It imports nothing of the gateway's own packages.
type Client struct {
	// BaseURL is the gateway's URL; a trailing /v1 is accepted.
	BaseURL string
	// Token is the bearer token ("" sends none).
	Token string
	// HTTP is the client to use (nil: http.DefaultClient).
	HTTP *http.Client

	// onGone is told the id of a session the gateway answered not found
	// (404 not_found) or gone (410) for (set by New).
	onGone func(id string)
}

// APIError is a gateway answer with the error envelope (or any non-2xx).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("gateway answered %d %s: %s", e.Status, e.Code, e.Message)
}

// IsStatus reports whether err is an *APIError with that HTTP status.
func IsStatus(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status
}

func (c *Client) base() string {
	u := strings.TrimRight(c.BaseURL, "/")
	return strings.TrimSuffix(u, "/v1")
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// request builds and sends a request to path (below the base URL, with
// its query) and returns the answer when it is 2xx; otherwise an *APIError.
func (c *Client) request(ctx context.Context, method, path string, body io.Reader, contentType string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base()+path, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		err := decodeError(resp)
		c.noteGone(path, err)
		return nil, err
	}
	return resp, nil
}

// IsGone reports whether err says the gateway has no such session (any
// more): 410, or 404 not_found (a missing file or process has its own
// code).
func IsGone(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) &&
		(ae.Status == http.StatusGone || ae.Status == http.StatusNotFound && ae.Code == "not_found")
}

// noteGone tells onGone of the session in path when err says the gateway
// has no such session (any more).
func (c *Client) noteGone(path string, err error) {
	if c.onGone == nil || !IsGone(err) {
		return
	}
	rest, ok := strings.CutPrefix(path, "/v1/sessions/")
	if !ok {
		return
	}
	rest, _, _ = strings.Cut(rest, "?")
	seg, _, _ := strings.Cut(rest, "/")
	if id, err := url.PathUnescape(seg); err == nil && id != "" {
		c.onGone(id)
	}
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return ParseAPIError(resp.StatusCode, b)
}

// ParseAPIError reads a non-2xx answer's body: the gateway's error
// envelope's code and message, or, for a body that is not one (a proxy's
// page), a code made of the status text and the body as the message.
func ParseAPIError(status int, b []byte) *APIError {
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	ae := &APIError{Status: status}
	if json.Unmarshal(b, &env) == nil && env.Error.Code != "" {
		ae.Code, ae.Message = env.Error.Code, env.Error.Message
	} else {
		ae.Code = strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "_")
		ae.Message = strings.TrimSpace(string(b))
	}
	return ae
}

// doJSON sends in as JSON (nil: no body) and decodes the answer into out
// (nil: discards it).
func (c *Client) doJSON(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.request(ctx, method, path, body, ct, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func sessionPath(id string) string { return "/v1/sessions/" + url.PathEscape(id) }

// Session is what the tools use of the gateway's Session.
type Session struct {
	SessionID string         `json:"sessionId"`
	Status    string         `json:"status"`
	Image     string         `json:"image"`
	ExpiresAt string         `json:"expiresAt"`
	TTL       int            `json:"ttl"`
	Metadata  map[string]any `json:"metadata"`
	Egress    struct {
		// Allow holds strings, and objects for entries with rules per
		// request.
		Allow []any  `json:"allow"`
		Mode  string `json:"mode"`
	} `json:"egress"`
}

// CreateSessionRequest is POST /v1/sessions's body.
type CreateSessionRequest struct {
	Name       string         `json:"name,omitempty"`
	TTL        int            `json:"ttl,omitempty"`
	Image      string         `json:"image,omitempty"`
	Egress     []string       `json:"egress,omitempty"`
	EgressMode string         `json:"egressMode,omitempty"`
	Metadata   map[string]any `json:"metadata,omitempty"`
}

// EgressPending is a connection waiting for approval.
type EgressPending struct {
	ID        string `json:"id"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Since     string `json:"since"`
	Via       string `json:"via"`
	UserAgent string `json:"userAgent,omitempty"`
}

// EgressPending lists session id's connections waiting for approval.
func (c *Client) EgressPending(ctx context.Context, id string) ([]EgressPending, error) {
	var out struct {
		Pending []EgressPending `json:"pending"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sessionPath(id)+"/egress/pending", nil, &out); err != nil {
		return nil, err
	}
	return out.Pending, nil
}

// DecideEgress answers session id's parked connection pendingID.
func (c *Client) DecideEgress(ctx context.Context, id, pendingID, decision string, remember bool) (*EgressPending, error) {
	var out EgressPending
	body := map[string]any{"decision": decision, "remember": remember}
	if err := c.doJSON(ctx, http.MethodPost, sessionPath(id)+"/egress/pending/"+url.PathEscape(pendingID), body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateSession creates a session.
func (c *Client) CreateSession(ctx context.Context, req CreateSessionRequest) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sessions", req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetSession reads one session.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, http.MethodGet, sessionPath(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// SessionNamed returns the id of the caller's live session named name, or
// "" when there is none.
func (c *Client) SessionNamed(ctx context.Context, name string) (string, error) {
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sessions?name="+url.QueryEscape(name), nil, &out); err != nil {
		return "", err
	}
	if len(out.Sessions) == 0 {
		return "", nil
	}
	return out.Sessions[0].SessionID, nil
}

// DeleteSession deletes a session.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, sessionPath(id), nil, nil)
}

// CommandRequest is POST .../commands's body.
type CommandRequest struct {
	Command        string  `json:"command"`
	Timeout        float64 `json:"timeout,omitempty"`
	MaxOutputBytes int     `json:"maxOutputBytes,omitempty"`
	Shell          string  `json:"shell,omitempty"`
	Cwd            string  `json:"cwd,omitempty"`
}

// CommandResult is the gateway's CommandResult.
type CommandResult struct {
	ExitCode     *int    `json:"exitCode"`
	ExitSignal   *string `json:"exitSignal"`
	Stdout       string  `json:"stdout"`
	Stderr       string  `json:"stderr"`
	StdoutBase64 []byte  `json:"stdoutBase64"`
	StderrBase64 []byte  `json:"stderrBase64"`
	Truncated    bool    `json:"truncated"`
	TimedOut     bool    `json:"timedOut"`
	DurationMs   int64   `json:"durationMs"`
	Cwd          string  `json:"cwd"`
}

// RunCommand runs a command in session id.
func (c *Client) RunCommand(ctx context.Context, id string, req CommandRequest) (*CommandResult, error) {
	var r CommandResult
	if err := c.doJSON(ctx, http.MethodPost, sessionPath(id)+"/commands", req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// PythonRequest is POST .../python's body.
type PythonRequest struct {
	Code           string  `json:"code"`
	Timeout        float64 `json:"timeout,omitempty"`
	Kernel         string  `json:"kernel,omitempty"`
	MaxOutputBytes int     `json:"maxOutputBytes,omitempty"`
}

// PythonError is an exception the kernel reported.
type PythonError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// PythonResult is the gateway's PythonResult.
type PythonResult struct {
	Kernel       string       `json:"kernel"`
	Stdout       string       `json:"stdout"`
	Stderr       string       `json:"stderr"`
	StdoutBase64 []byte       `json:"stdoutBase64"`
	StderrBase64 []byte       `json:"stderrBase64"`
	Result       *string      `json:"result"`
	Error        *PythonError `json:"error"`
	DurationMs   int64        `json:"durationMs"`
	Truncated    bool         `json:"truncated"`
	TimedOut     bool         `json:"timedOut"`
	Interrupted  bool         `json:"interrupted"`
	Restarted    bool         `json:"restarted"`
	StateLost    bool         `json:"stateLost"`
}

// RunPython runs code in the session's persistent kernel.
func (c *Client) RunPython(ctx context.Context, id string, req PythonRequest) (*PythonResult, error) {
	var r PythonResult
	if err := c.doJSON(ctx, http.MethodPost, sessionPath(id)+"/python", req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ReadFile reads at most max bytes of the file at path from offset on,
// and reports the file's size.
func (c *Client) ReadFile(ctx context.Context, id, path string, offset, max int64) (data []byte, size int64, err error) {
	q := url.Values{"path": {path}}
	h := http.Header{"Range": {fmt.Sprintf("bytes=%d-%d", offset, offset+max-1)}}
	resp, err := c.request(ctx, http.MethodGet, sessionPath(id)+"/files?"+q.Encode(), nil, "", h)
	if err != nil {
		if IsStatus(err, http.StatusRequestedRangeNotSatisfiable) {
			// Past the end (or an empty file): nothing to read; the size
			// is the file's, from a HEAD.
			hr, herr := c.request(ctx, http.MethodHead, sessionPath(id)+"/files?"+q.Encode(), nil, "", nil)
			if herr != nil {
				return nil, 0, herr
			}
			hr.Body.Close()
			if hr.ContentLength < 0 {
				return nil, 0, nil
			}
			return nil, hr.ContentLength, nil
		}
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err = io.ReadAll(io.LimitReader(resp.Body, max))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	size = offset + int64(len(data))
	if cr := resp.Header.Get("Content-Range"); cr != "" {
		if _, total, ok := strings.Cut(cr, "/"); ok {
			fmt.Sscan(total, &size)
		}
	} else if resp.ContentLength >= 0 {
		size = resp.ContentLength // 200: the whole file
	}
	return data, size, nil
}

// FileEntry is one entry of a listing, or a written file.
type FileEntry struct {
	Name      string `json:"name"`
	Path      string `json:"path"`
	Type      string `json:"type"`
	SizeBytes int64  `json:"sizeBytes"`
	Mode      string `json:"mode"`
	Mtime     string `json:"mtime"`
}

// WriteFile writes data to path, creating missing parent directories.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte) (*FileEntry, error) {
	q := url.Values{"path": {path}, "mkdirs": {"true"}}
	resp, err := c.request(ctx, http.MethodPut, sessionPath(id)+"/files?"+q.Encode(), bytes.NewReader(data), "application/octet-stream", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var e FileEntry
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return nil, fmt.Errorf("write %s: decode answer: %w", path, err)
	}
	return &e, nil
}

// ListFiles lists the directory at path.
func (c *Client) ListFiles(ctx context.Context, id, path string, recursive bool) ([]FileEntry, bool, error) {
	q := url.Values{"path": {path}, "list": {"true"}}
	if recursive {
		q.Set("recursive", "true")
	}
	var l struct {
		Entries   []FileEntry `json:"entries"`
		Truncated bool        `json:"truncated"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sessionPath(id)+"/files?"+q.Encode(), nil, &l); err != nil {
		return nil, false, err
	}
	return l.Entries, l.Truncated, nil
}

// StartProcessRequest is POST .../processes's body.
type StartProcessRequest struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd,omitempty"`
	Name    string `json:"name,omitempty"`
}

// Process is the gateway's Process.
type Process struct {
	ProcessID   string `json:"processId"`
	Pid         int    `json:"pid,omitempty"`
	Name        string `json:"name,omitempty"`
	Command     string `json:"command"`
	Status      string `json:"status"`
	ExitCode    *int   `json:"exitCode,omitempty"`
	ExitSignal  string `json:"exitSignal,omitempty"`
	OutputBytes int64  `json:"outputBytes"`
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, id string, req StartProcessRequest) (*Process, error) {
	var p Process
	if err := c.doJSON(ctx, http.MethodPost, sessionPath(id)+"/processes", req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetProcess reads one background process.
func (c *Client) GetProcess(ctx context.Context, id, pid string) (*Process, error) {
	var p Process
	if err := c.doJSON(ctx, http.MethodGet, sessionPath(id)+"/processes/"+url.PathEscape(pid), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// OutputLine is one ProcessOutputLine.
type OutputLine struct {
	Offset       int64   `json:"offset"`
	Stdout       *string `json:"stdout"`
	Stderr       *string `json:"stderr"`
	StdoutBase64 []byte  `json:"stdoutBase64"`
	StderrBase64 []byte  `json:"stderrBase64"`
	DroppedBytes int64   `json:"droppedBytes"`
	Done         *bool   `json:"done"`
	ExitCode     *int    `json:"exitCode"`
	ExitSignal   string  `json:"exitSignal"`
	NextOffset   int64   `json:"nextOffset"`
}

// ProcessOutput reads a process's output from offset to its current
// end (no follow), calling fn for each line.
func (c *Client) ProcessOutput(ctx context.Context, id, pid string, offset int64, fn func(OutputLine) error) error {
	q := url.Values{"offset": {fmt.Sprint(offset)}}
	resp, err := c.request(ctx, http.MethodGet, sessionPath(id)+"/processes/"+url.PathEscape(pid)+"/output?"+q.Encode(), nil, "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var l OutputLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("process output: decode line: %w", err)
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("process output: %w", err)
	}
	return nil
}
