package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/mcpserver"
)

// apiFlags are the connection flags of the cobra client commands, with
// the same names and environment variables as proxy's clientFlags.
type apiFlags struct {
	clientFlags
}

func (f *apiFlags) register(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.apiURL, "api-url", "", "gateway URL, may end in /v1 (env SANDBOX_API_URL; default "+defaultAPIURL+")")
	fs.StringVar(&f.token, "token", "", "bearer token (env SANDBOX_API_TOKEN)")
	fs.StringVar(&f.caFile, "cacert", "", "PEM CA bundle to verify the gateway's certificate (env SANDBOX_CA_FILE)")
	fs.BoolVar(&f.insecure, "insecure", false, "skip TLS certificate verification (testing only)")
}

// resolve fills what the flags left empty from the environment (the
// token is read here, not as a flag default, so help never shows it).
func (f *apiFlags) resolve() clientFlags {
	c := f.clientFlags
	if c.apiURL == "" {
		c.apiURL = os.Getenv("SANDBOX_API_URL")
	}
	if c.apiURL == "" {
		c.apiURL = defaultAPIURL
	}
	if c.token == "" {
		c.token = os.Getenv("SANDBOX_API_TOKEN")
	}
	if c.caFile == "" {
		c.caFile = os.Getenv("SANDBOX_CA_FILE")
	}
	return c
}

// apiClient speaks the gateway's REST API for the session commands.
type apiClient struct {
	cf   clientFlags
	base string
	http *http.Client
}

func (f *apiFlags) client() (*apiClient, error) {
	cf := f.resolve()
	u, err := url.Parse(cf.apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageErrorf("invalid API URL %q: want http://HOST:PORT or https://HOST", cf.apiURL)
	}
	tc, err := cf.tlsConfig()
	if err != nil {
		return nil, err
	}
	return &apiClient{
		cf:   cf,
		base: strings.TrimSuffix(strings.TrimRight(cf.apiURL, "/"), "/v1"),
		http: &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}},
	}, nil
}

// restError is a non-2xx answer, with the error envelope's code.
type restError struct {
	Status  int
	Code    string
	Message string
}

func (e *restError) Error() string {
	if e.Status == http.StatusUnauthorized {
		return fmt.Sprintf("unauthorized (401 %s): %s; set SANDBOX_API_TOKEN or --token", e.Code, e.Message)
	}
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

func isStatus(err error, status int) bool {
	var ae *restError
	return errors.As(err, &ae) && ae.Status == status
}

// do sends in as JSON (nil: no body) and returns the answer's body.
func (c *apiClient) do(ctx context.Context, method, path string, in any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.cf.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cf.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the gateway at %s (check SANDBOX_API_URL or --api-url): %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		ae := mcpserver.ParseAPIError(resp.StatusCode, b)
		return nil, &restError{Status: ae.Status, Code: ae.Code, Message: ae.Message}
	}
	return b, nil
}

func sessPath(id string) string { return "/v1/sessions/" + url.PathEscape(id) }

// session is what the commands show of the API's Session.
type session struct {
	SessionID      string         `json:"sessionId"`
	Name           string         `json:"name"`
	Status         string         `json:"status"`
	StatusReason   string         `json:"statusReason"`
	Image          string         `json:"image"`
	CreatedAt      string         `json:"createdAt"`
	ExpiresAt      string         `json:"expiresAt"`
	LastActivityAt string         `json:"lastActivityAt"`
	Workspace      string         `json:"workspace"`
	Isolation      string         `json:"isolation"`
	Unenforced     []string       `json:"unenforced"`
	Resources      map[string]any `json:"resources"`
	Egress         struct {
		Allow []string `json:"allow"`
	} `json:"egress"`
	SSH struct {
		Username       string   `json:"username"`
		Password       string   `json:"password"`
		HostKeys       []string `json:"hostKeys"`
		KnownHostsLine string   `json:"knownHostsLine"`
	} `json:"ssh"`
}

// getSession reads one session by id or name; raw is the API's JSON.
func (c *apiClient) getSession(ctx context.Context, ref string) (*session, []byte, error) {
	b, err := c.do(ctx, http.MethodGet, sessPath(ref), nil)
	if err != nil {
		if isStatus(err, http.StatusNotFound) {
			return nil, nil, fmt.Errorf("session %q not found: no session of yours has this id or name (it may have ended)", ref)
		}
		return nil, nil, err
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, fmt.Errorf("decode session: %w", err)
	}
	return &s, b, nil
}

// sshClient opens an SSH connection to the session through the gateway's
// CONNECT tunnel, pinning the gateway's host keys.
func (c *apiClient) sshClient(ctx context.Context, s *session) (*gossh.Client, error) {
	var keys []gossh.PublicKey
	for _, line := range s.SSH.HostKeys {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
		if err == nil {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("the gateway gave no host keys for session %s", s.SessionID)
	}
	d, err := c.cf.dialer()
	if err != nil {
		return nil, err
	}
	d.Timeout = 30 * time.Second
	conn, err := d.Dial(ctx, s.SessionID)
	if err != nil {
		return nil, fmt.Errorf("tunnel to %s: %s", s.SessionID, describeDialError(err, s.SessionID))
	}
	cfg := &gossh.ClientConfig{
		User: "sandbox",
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
			for _, k := range keys {
				if bytes.Equal(k.Marshal(), key.Marshal()) {
					return nil
				}
			}
			return fmt.Errorf("host key %s is not the gateway's", gossh.FingerprintSHA256(key))
		},
		Timeout: 30 * time.Second,
	}
	cc, chans, reqs, err := gossh.NewClientConn(conn, s.SessionID, cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh to %s: %w", s.SessionID, err)
	}
	return gossh.NewClient(cc, chans, reqs), nil
}
