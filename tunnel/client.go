package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// StatusError is a CONNECT refused by the server.
type StatusError struct {
	StatusCode int
	Code       string
	Message    string
	// RetryAfter is the answer's Retry-After (0: none).
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("gateway refused the tunnel: %d %s", e.StatusCode, msg)
}

// Dialer opens tunnels to sessions.
type Dialer struct {
	// APIURL is the gateway URL, e.g. http://127.0.0.1:8080 or https://host/v1.
	APIURL string
	// Token is the bearer token.
	Token string
	// TLSConfig is used for https URLs (nil: system roots).
	TLSConfig *tls.Config
	// Timeout bounds connecting and the CONNECT exchange (default 30s).
	Timeout time.Duration
	// RetryStartups is how long a CONNECT refused because too many tunnels
	// are in SSH authentication (429 too_many_ssh_startups, 503
	// ssh_startups_full) is retried, after each answer's Retry-After
	// (0: not retried).
	RetryStartups time.Duration
	// Transport is TransportConnect (""), TransportWebSocket or
	// TransportAuto (websocket.go).
	Transport string
}

// startupCodes are the refusals RetryStartups retries.
var startupCodes = map[string]bool{"too_many_ssh_startups": true, "ssh_startups_full": true}

// ConnectPath returns the CONNECT path for id under the API URL's path: a
// URL ending in /v1 gets /sessions/{id} appended, any other /v1/sessions/{id}.
func ConnectPath(apiPath, id string) string {
	p := strings.TrimRight(apiPath, "/")
	if !strings.HasSuffix(p, "/v1") {
		p += "/v1"
	}
	return p + "/sessions/" + url.PathEscape(id)
}

// Dial opens a tunnel to session id and returns the raw byte stream.
func (d *Dialer) Dial(ctx context.Context, id string) (net.Conn, error) {
	end := time.Now().Add(d.RetryStartups)
	for {
		c, err := d.dial(ctx, id)
		se, ok := err.(*StatusError)
		if !ok || !startupCodes[se.Code] {
			return c, err
		}
		wait := min(max(se.RetryAfter, 100*time.Millisecond), 5*time.Second)
		if time.Now().Add(wait).After(end) {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

func (d *Dialer) dial(ctx context.Context, id string) (net.Conn, error) {
	u, err := url.Parse(d.APIURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid API URL %q: want http(s)://host[:port][/v1]", d.APIURL)
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	transport, err := ParseTransport(d.Transport)
	if err != nil {
		return nil, err
	}
	if transport == TransportWebSocket {
		return d.dialWebSocket(ctx, u, id, timeout)
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host = net.JoinHostPort(u.Hostname(), "443")
		} else {
			host = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	nd := net.Dialer{Timeout: timeout}
	conn, err := nd.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("connect to gateway: %w", err)
	}
	if u.Scheme == "https" {
		cfg := d.TLSConfig.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		tc := tls.Client(conn, cfg)
		tc.SetDeadline(time.Now().Add(timeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("tls handshake with gateway: %w", err)
		}
		conn = tc
	}
	c, err := connect(conn, u.Host, ConnectPath(u.Path, id), d.Token, timeout)
	if err != nil {
		conn.Close()
		if d.Transport == TransportAuto && connectRefused(err) {
			return d.dialWebSocket(ctx, u, id, timeout)
		}
		return nil, err
	}
	return c, nil
}

func connect(conn net.Conn, host, path, token string, timeout time.Duration) (net.Conn, error) {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if err := WriteConnect(conn, host, path, token); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	if err := ReadConnectResponse(br); err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if n := br.Buffered(); n > 0 {
		head, _ := br.Peek(n)
		return &prefixConn{Conn: conn, head: bytes.Clone(head)}, nil
	}
	return conn, nil
}

// WriteConnect sends the CONNECT request for path with the bearer token.
func WriteConnect(w io.Writer, host, path, token string) error {
	req := "CONNECT " + path + " HTTP/1.1\r\nHost: " + host + "\r\n"
	if token != "" {
		req += "Proxy-Authorization: Bearer " + token + "\r\n"
	}
	if _, err := io.WriteString(w, req+"\r\n"); err != nil {
		return fmt.Errorf("send CONNECT: %w", err)
	}
	return nil
}

// ReadConnectResponse reads the answer to a CONNECT from r: nil for 200,
// a *StatusError (with the gateway's error code and message) otherwise.
func ReadConnectResponse(r *bufio.Reader) error {
	resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return &responseError{err: err}
	}
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	defer resp.Body.Close()
	se := &StatusError{StatusCode: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		se.RetryAfter = time.Duration(secs) * time.Second
	}
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) == nil {
		se.Code, se.Message = body.Error.Code, body.Error.Message
	}
	return se
}
