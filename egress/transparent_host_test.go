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
	pol := &Policy{Allow: mustList(t, "allowed.test")}
	long := strings.Repeat("a", 20000) + ".test"
	reason := plainHostReason(pol, long, "allowed.test", 80, false)
	if !strings.Contains(reason, "does not match the resolved name allowed.test") {
		t.Fatalf("reason %.200q", reason)
	}
	if len(reason) > 512 {
		t.Errorf("the reason is %d bytes long; want it bounded", len(reason))
	}
	if r := plainHostReason(pol, "allowed.test:80", "allowed.test", 80, false); r != "" {
		t.Errorf("the resolved name's Host: %q", r)
	}
	if r := plainHostReason(pol, "other.test", "203.0.113.7", 80, true); !strings.Contains(r, "not in this session's egress list") {
		t.Errorf("an IP literal's Host outside the list: %q", r)
	}
}

// Empty lines before the request line (which servers skip, RFC 9112
// 2.2) do not hide a request from the HTTP check, and methods other than
// the common ones are recognized too.
func TestTransparentMethodLeadingEmptyLines(t *testing.T) {
	p, _ := newTestProxy(t, Config{})
	s, _ := startSession(t, p, "hostcrlf", Policy{Allow: mustList(t, "allowed.test")}, nil)
	client, other := net.Pipe()
	defer client.Close()
	defer other.Close()
	for _, req := range []string{
		"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"\r\n\r\nPOST / HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 0\r\n\r\n",
		"\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"PROPFIND / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
	} {
		got, isHTTP, err := s.readMethod(client, []byte(req))
		if err != nil || !isHTTP || string(got) != req {
			t.Errorf("%q: http %v, %v", req, isHTTP, err)
		}
	}
	if _, isHTTP, err := s.readMethod(client, []byte("SSH-2.0-OpenSSH_9.6\r\n")); err != nil || isHTTP {
		t.Errorf("an SSH banner: http %v, %v", isHTTP, err)
	}
}
