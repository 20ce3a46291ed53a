package egress

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// TripwireBodyBytes is how much of a request's body (per request) the
// proxy reads for placeholders before forwarding it.
const TripwireBodyBytes = 64 << 10

// tripwire returns the name of a secret bound to hosts whose placeholder r
// carries (in its URL, Host, a header, or its body's first
// TripwireBodyBytes, in any case) while it is headed for host:port, to which that
// secret is not bound; "" when none. The body bytes read are put back.
// A placeholder is no secret, but one sent elsewhere is a sign that
// something in the sandbox tries to send the credential where it does not
// belong.
func (pol *Policy) tripwire(r *http.Request, host string, port uint16) (string, error) {
	var others []Secret
	for _, sec := range pol.Secrets {
		if sec.Placeholder != "" && !sec.Hosts.Allows(host, port) {
			others = append(others, sec)
		}
	}
	if len(others) == 0 {
		return "", nil
	}
	var head []byte
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, TripwireBodyBytes))
		if err != nil {
			return "", fmt.Errorf("reading the request body: %w", err)
		}
		head = b
		r.Body = &readCloser{Reader: io.MultiReader(bytes.NewReader(b), r.Body), Closer: r.Body}
	}
	// Whatever its case: a tool that changes it does not slip by.
	lower := strings.ToLower
	u, uri, h, body := lower(r.URL.String()), lower(r.RequestURI), lower(r.Host), bytes.ToLower(head)
	for _, sec := range others {
		ph := lower(sec.Placeholder)
		if strings.Contains(u, ph) || strings.Contains(uri, ph) || strings.Contains(h, ph) ||
			bytes.Contains(body, []byte(ph)) {
			return sec.Name, nil
		}
		for _, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(lower(v), ph) {
					return sec.Name, nil
				}
			}
		}
	}
	return "", nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// checkTripwire applies the tripwire to a request for target (host:port)
// and answers it when it trips or fails: false then.
func (s *Session) checkTripwire(w http.ResponseWriter, r *http.Request, pol *Policy, rec *record, host string, port uint16) bool {
	name, err := pol.tripwire(r, host, port)
	target := hostPort(host, port)
	switch {
	case err != nil:
		rec.deny(err.Error())
		writeLine(w, http.StatusBadRequest, target+": "+err.Error())
		return false
	case name != "":
		rec.mu.Lock()
		rec.tripwire = name
		rec.mu.Unlock()
		reason := fmt.Sprintf("tripwire: the placeholder of secret %s, which is bound to other hosts", name)
		rec.deny(reason)
		writeLine(w, http.StatusForbidden, target+" denied: "+reason)
		return false
	}
	return true
}
