package egress

import (
	"net"
	"strings"
	"testing"
)

// A transparent connection's request whose Host does not match the
// resolved name is refused with a reason of bounded size: the reason goes
// to the log, the audit log and the session's egress decisions (1000
// kept), and a Host header may be as long as MaxHeaderBytes.
func TestTransparentHostReasonBounded(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "hostlen", Policy{Allow: mustList(t, "allowed.test")}, nil)
	client, other := net.Pipe()
	defer client.Close()
	defer other.Close()
	tn := &tunnel{s: s, rec: newRecord("tcp"), pol: s.pol.Load(), host: "allowed.test", port: 80, transparent: true}
	long := strings.Repeat("a", 20000) + ".test"
	req := "GET / HTTP/1.1\r\nHost: " + long + "\r\n\r\n"
	_, reason, err := tn.checkHTTPHost(client, []byte(req))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "does not match the resolved name allowed.test") {
		t.Fatalf("reason %.200q", reason)
	}
	if len(reason) > 512 {
		t.Errorf("the reason is %d bytes long; want it bounded", len(reason))
	}
}

// Empty lines before the request line (which servers skip, RFC 9112
// 2.2) do not hide a spliced request's Host from the check.
func TestTransparentHostLeadingEmptyLines(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "hostcrlf", Policy{Allow: mustList(t, "allowed.test")}, nil)
	client, other := net.Pipe()
	defer client.Close()
	defer other.Close()
	tn := &tunnel{s: s, rec: newRecord("tcp"), pol: s.pol.Load(), host: "allowed.test", port: 80, transparent: true}
	for _, req := range []string{
		"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"\r\n\r\nPOST / HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 0\r\n\r\n",
		"\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		// Methods other than the common ones are read too.
		"PROPFIND / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
	} {
		_, reason, err := tn.checkHTTPHost(client, []byte(req))
		if err != nil || !strings.Contains(reason, "does not match the resolved name") {
			t.Errorf("%q: reason %q, %v", req, reason, err)
		}
	}
	_, reason, err := tn.checkHTTPHost(client, []byte("\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
	if err != nil || reason != "" {
		t.Errorf("the resolved name's Host: %q %v", reason, err)
	}
}
