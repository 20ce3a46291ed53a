package egress

import "testing"

func TestRules(t *testing.T) {
	l, err := ParseList([]string{
		`{"host":"API.github.com","port":443,"methods":["get","POST","GET"],"paths":["/repos/acme/*"]}`,
		`{"host":"x.test","paths":["/exact"]}`,
		"plain.test",
	})
	if err != nil {
		t.Fatal(err)
	}
	const rule = `{"host":"api.github.com","port":443,"methods":["GET","POST"],"paths":["/repos/acme/*"]}`
	if got := l.Entries(); got[0] != rule || got[1] != `{"host":"x.test","paths":["/exact"]}` || got[2] != "plain.test" {
		t.Errorf("canonical entries %q", got)
	}
	if got := l.HostEntries(); got[0] != "api.github.com:443" || got[1] != "x.test" {
		t.Errorf("host entries %q", got)
	}
	for _, c := range []struct {
		host         string
		port         uint16
		method, path string
		ok           bool
		by           string
	}{
		{"api.github.com", 443, "GET", "/repos/acme/x", true, ""},
		{"api.github.com", 443, "POST", "/repos/acme/", true, ""},
		{"api.github.com", 443, "DELETE", "/repos/acme/x", false, rule},
		{"api.github.com", 443, "GET", "/repos/other", false, rule},
		{"api.github.com", 443, "GET", "/repos/acme/../other", false, rule},
		{"api.github.com", 443, "GET", "/repos/acme//x", false, rule},
		{"api.github.com", 80, "GET", "/repos/acme/x", false, ""},
		{"x.test", 80, "PUT", "/exact", true, ""},
		{"x.test", 443, "GET", "/exact/more", false, `{"host":"x.test","paths":["/exact"]}`},
		{"plain.test", 443, "DELETE", "/anything/../at/all", true, ""},
	} {
		ok, by := l.AllowsRequest(c.host, c.port, c.method, c.path)
		if ok != c.ok || by != c.by {
			t.Errorf("%s %s:%d%s: %v %q, want %v %q", c.method, c.host, c.port, c.path, ok, by, c.ok, c.by)
		}
	}
	if !l.Allows("api.github.com", 443) || !l.OnlyRules("api.github.com", 443) || l.OnlyRules("plain.test", 443) {
		t.Error("Allows or OnlyRules")
	}
	// The operator's bounds hold objects as they hold strings.
	b, _ := ParseBounds([]string{"*.github.com:443"})
	if out := b.Outside(l); len(out) != 2 || out[0] != `{"host":"x.test","paths":["/exact"]}` {
		t.Errorf("outside %q", out)
	}
	for _, bad := range []string{
		`{"host":"a.test","paths":["x"]}`, `{"host":"a.test","paths":["/a*b"]}`, `{"host":"a.test","methods":["G1"]}`,
		`{"host":"a.test:80","port":80}`, `{"port":80}`, `{"host":"a.test","extra":1}`, `{"host":"a.test"} x`,
		`{"host":"a.test","paths":["/a b"]}`, `{"host":"a.test","port":70000}`,
	} {
		if _, err := ParseList([]string{bad}); err == nil {
			t.Errorf("%s parsed", bad)
		} else if le, ok := err.(*ListError); !ok || le.Entries[0].Entry != bad || le.Entries[0].Reason == "" {
			t.Errorf("%s: error %v does not name it", bad, err)
		}
	}
	if _, err := ParseBounds([]string{`{"host":"a.test"}`}); err == nil {
		t.Error("an object pattern parsed")
	}
}
