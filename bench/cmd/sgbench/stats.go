package main

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Stats summarises samples (seconds for timings, bytes for memory).
type Stats struct {
	N      int       `json:"n"`
	Median float64   `json:"median"`
	Mean   float64   `json:"mean"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	P10    float64   `json:"p10"`
	P90    float64   `json:"p90"`
	P99    float64   `json:"p99"`
	Values []float64 `json:"values,omitempty"`
}

// NewStats computes Stats over xs (which it does not modify).
func NewStats(xs []float64) *Stats {
	s := &Stats{N: len(xs)}
	if len(xs) == 0 {
		return s
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	sum := 0.0
	for _, x := range sorted {
		sum += x
	}
	s.Mean = sum / float64(len(sorted))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	s.Median = Percentile(sorted, 50)
	s.P10 = Percentile(sorted, 10)
	s.P90 = Percentile(sorted, 90)
	s.P99 = Percentile(sorted, 99)
	if len(xs) <= 1000 {
		s.Values = append([]float64(nil), xs...)
	}
	return s
}

// Percentile returns the p-th percentile (0..100) of sorted samples with
// linear interpolation between closest ranks.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n == 1 {
		return sorted[0]
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	if lo < 0 {
		lo = 0
	}
	if hi >= n {
		hi = n - 1
	}
	frac := pos - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

// Pick returns the statistic named by which: "median", "p50", "p99" or "value".
func (s *Stats) Pick(which string) float64 {
	if s == nil || s.N == 0 {
		return math.NaN()
	}
	switch which {
	case "p99":
		return s.P99
	case "p90":
		return s.P90
	case "mean":
		return s.Mean
	}
	return s.Median
}

// Spread is the range shown next to a value: min–max below 10 samples,
// p10–p90 otherwise, and p90–max next to a p99.
func (s *Stats) Spread(stat, unit string) string {
	if s == nil || s.N <= 1 {
		return "–"
	}
	if stat == "p99" {
		return fmt.Sprintf("%s–%s", formatValue(s.P90, unit), formatValue(s.Max, unit))
	}
	if s.N < 10 {
		return fmt.Sprintf("%s–%s", formatValue(s.Min, unit), formatValue(s.Max, unit))
	}
	return fmt.Sprintf("%s–%s", formatValue(s.P10, unit), formatValue(s.P90, unit))
}

// formatValue renders v in unit: "s" values are seconds shown as ms or s,
// "B" values are bytes shown as KiB or MiB.
func formatValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	switch unit {
	case "s":
		switch {
		case v < 0.01:
			return fmt.Sprintf("%.2f ms", v*1000)
		case v < 1:
			return fmt.Sprintf("%.1f ms", v*1000)
		default:
			return fmt.Sprintf("%.2f s", v)
		}
	case "B":
		switch {
		case v < 10<<10:
			return fmt.Sprintf("%.1f KiB", v/1024)
		case v < 10<<20:
			return fmt.Sprintf("%.0f KiB", v/1024)
		default:
			return fmt.Sprintf("%.1f MiB", v/(1<<20))
		}
	}
	return fmt.Sprintf("%.3g", v)
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// ratio is a/b, NaN when either is missing.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}
