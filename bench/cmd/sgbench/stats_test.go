package main

import (
	"math"
	"strings"
	"testing"
)

func TestPercentile(t *testing.T) {
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		p, want float64
	}{
		{0, 1}, {50, 5.5}, {100, 10}, {90, 9.1}, {10, 1.9},
	}
	for _, tt := range tests {
		if got := Percentile(sorted, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("Percentile of nothing is not NaN")
	}
}

func TestStatsAndFormatting(t *testing.T) {
	s := NewStats([]float64{0.003, 0.001, 0.002})
	if s.N != 3 || s.Median != 0.002 || s.Min != 0.001 || s.Max != 0.003 {
		t.Fatalf("stats %+v", s)
	}
	if got := s.Spread("median", "s"); got != "1.00 ms–3.00 ms" {
		t.Errorf("spread %q", got)
	}
	if got := formatValue(2.5, "s"); got != "2.50 s" {
		t.Errorf("format %q", got)
	}
	if got := formatValue(150*1024, "B"); got != "150 KiB" {
		t.Errorf("format %q", got)
	}
	if !math.IsNaN(ratio(1, 0)) || ratio(1, 2) != 0.5 {
		t.Error("ratio")
	}
}

func TestMarkdownTable(t *testing.T) {
	r := &Report{Rows: []*Row{
		{ID: "1", Name: "new connection", Stat: "median", Unit: "s", SG: NewStats([]float64{0.01}), Ref: NewStats([]float64{0.02}), RefName: "sshd"},
		{ID: "7", Name: "paramiko", Skipped: "SDK missing"},
	}}
	r.finish()
	md := r.Markdown()
	for _, want := range []string{"| 1 | new connection", "0.50", "skipped: SDK missing"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
