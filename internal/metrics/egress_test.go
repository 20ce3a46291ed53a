package metrics

import (
	"testing"

	"github.com/sandgate/sandgate/egress"
)

var _ egress.Metrics = (*Metrics)(nil)

func TestEgressBytes(t *testing.T) {
	m := New()
	_, body := scrape(t, m.Handler(""), "")
	wantLines(t, body, `sandgate_egress_bytes_total{direction="in"} 0`, `sandgate_egress_bytes_total{direction="out"} 0`)
	m.EgressBytes(1000, 0)
	m.EgressBytes(0, 30)
	m.EgressBytes(24, 12)
	_, body = scrape(t, m.Handler(""), "")
	wantLines(t, body, `sandgate_egress_bytes_total{direction="in"} 1024`, `sandgate_egress_bytes_total{direction="out"} 42`)
}
