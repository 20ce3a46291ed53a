// Copyright 2026 The sandgate Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package ssh

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// simulate runs a sender that keeps as much in flight as the pacer allows
// against a peer that gives back each packet (32 KiB) after rtt, taking
// at most rate bytes per second, with window adjustments of step bytes;
// it returns the limit after d of simulated time.
func simulate(t *testing.T, init uint32, rtt time.Duration, rate float64, step uint32, d time.Duration) *pacer {
	return simulateSends(t, init, rtt, rate, step, d, false)
}

// simulateSends is simulate; with sparse, the sender has one packet to
// send every millisecond, never more than the pacer allows.
func simulateSends(t *testing.T, init uint32, rtt time.Duration, rate float64, step uint32, d time.Duration, sparse bool) *pacer {
	t.Helper()
	const pkt = 32 << 10
	p := &pacer{}
	p.opened(init)
	win := init
	now := time.Unix(0, 0)
	end := now.Add(d)
	type ack struct {
		at time.Time
		n  uint32
	}
	var pending []ack // the peer's adjustments to come, in time order
	var consumed time.Time
	var owed uint32
	var lastSend time.Time
	tick := 100 * time.Microsecond
	for now.Before(end) {
		for len(pending) > 0 && !pending[0].at.After(now) {
			win += pending[0].n
			p.adjusted(pending[0].n, pending[0].at)
			pending = pending[1:]
		}
		for win > p.hold() && win-p.hold() >= pkt && (!sparse || now.Sub(lastSend) >= time.Millisecond) {
			lastSend = now
			win -= pkt
			p.reserved(pkt, now)
			// The peer takes it after rtt, or once it is through what
			// came before at rate, and gives back in steps.
			at := now.Add(rtt)
			if next := consumed.Add(time.Duration(float64(pkt) / rate * float64(time.Second))); next.After(at) {
				at = next
			}
			consumed = at
			owed += pkt
			if owed >= step {
				pending = append(pending, ack{at, owed})
				owed = 0
			}
		}
		if !sparse {
			p.limited = true // it has more to send than it may
		}
		now = now.Add(tick)
	}
	return p
}

func TestPacerFillsTheWindowOfALongLink(t *testing.T) {
	// 50 ms away, a peer that could take 1 GB/s: the window is the limit.
	p := simulate(t, 2<<20, 50*time.Millisecond, 1e9, 96<<10, 2*time.Second)
	if p.limit != p.init {
		t.Errorf("limit %d KiB of a %d KiB window on a 50 ms link: the pacing cut a link that needs it all", p.limit>>10, p.init>>10)
	}
}

func TestPacerHoldsBackFromABusyPeer(t *testing.T) {
	// Beside the sender, taking 300 MB/s: the link needs little in flight.
	p := simulate(t, 2<<20, 50*time.Microsecond, 300e6, 96<<10, time.Second)
	if p.limit > 512<<10 {
		t.Errorf("limit %d KiB for a peer 50 µs away that is the bottleneck", p.limit>>10)
	}
}

func TestPacerKeepsTheLimitOfASenderWithLittleToSend(t *testing.T) {
	// 32 KiB a millisecond to a near peer: the rate it sees is the
	// sender's, not the peer's, and must not bring the limit down (a
	// burst after it, to a far peer, would start from the floor).
	p := simulateSends(t, 2<<20, 50*time.Microsecond, 300e6, 32<<10, time.Second, true)
	if p.limit != p.init {
		t.Errorf("limit %d KiB after a second of sparse sends", p.limit>>10)
	}
}

func TestPacerLeavesRoomForAHalfWindowPeer(t *testing.T) {
	// A peer that gives window back only once half of it is used up.
	p := simulate(t, 2<<20, 50*time.Microsecond, 300e6, 1<<20, time.Second)
	if p.limit != p.init {
		t.Errorf("limit %d KiB for a peer that gives back 1 MiB at a time: it would never give the next", p.limit>>10)
	}
}

// A writer that the limit alone holds back, from a peer that gives no
// window back, turns the pacing off after paceStall instead of waiting
// for ever.
func TestPacerStallTurnsItOff(t *testing.T) {
	w := &window{Cond: newCond()}
	w.add(2 << 20)
	w.L.Lock()
	w.pace.limit = paceFloor // as if measured
	w.L.Unlock()
	if n, err := w.reserve(paceFloor); err != nil || n != paceFloor {
		t.Fatalf("reserve within the limit: %d, %v", n, err)
	}
	done := make(chan uint32, 1)
	go func() {
		n, _ := w.reserve(32 << 10)
		done <- n
	}()
	select {
	case n := <-done:
		t.Fatalf("reserved %d past the limit at once", n)
	case <-time.After(paceStall / 2):
	}
	select {
	case n := <-done:
		if n != 32<<10 {
			t.Errorf("reserved %d", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still held back by the pacing, with window left and no adjustment coming")
	}
	w.L.Lock()
	defer w.L.Unlock()
	if !w.pace.off {
		t.Error("pacing still on after a stall")
	}
}

// simulateLink is simulate on a link whose round trip is rtt(now) for a
// packet sent at now (the peer gives window back in order) and that
// carries at most rate(now) bytes per second, with the pacing on or off; it returns the bytes given back in the second half
// of d.
func simulateLink(t *testing.T, init uint32, rtt func(now time.Time) time.Duration, rate func(now time.Time) float64, step uint32, d time.Duration, paced bool) (uint64, *pacer) {
	return simulateTCP(t, init, rtt, rate, step, d, paced, false)
}

// simulateTCP is simulateLink; with slowStart, the link also carries no
// more in flight than a TCP congestion window in slow start: ten packets
// of 1460 bytes at first, grown by what is acked while it was full (each
// packet is acked when it arrives, the window given back in steps).
func simulateTCP(t *testing.T, init uint32, rtt func(now time.Time) time.Duration, rate func(now time.Time) float64, step uint32, d time.Duration, paced, slowStart bool) (uint64, *pacer) {
	t.Helper()
	const pkt = 32 << 10
	p := &pacer{}
	p.opened(init)
	p.off = p.off || !paced
	win := init
	start := time.Unix(0, 0)
	now, half, end := start, start.Add(d/2), start.Add(d)
	type ack struct {
		at time.Time
		n  uint32
	}
	var pending []ack
	var consumed, last time.Time
	var owed uint32
	var late uint64
	cwnd := uint64(math.MaxUint64)
	if slowStart {
		cwnd = 10 * 1460
	}
	var sent, acked uint64  // at the TCP level: each packet is acked after rtt
	var tcpAcks []time.Time // of the packets not yet acked, in order
	for now.Before(end) {
		for len(tcpAcks) > 0 && !tcpAcks[0].After(now) {
			if sent-acked+pkt > cwnd {
				cwnd += pkt
			}
			acked += pkt
			tcpAcks = tcpAcks[1:]
		}
		for len(pending) > 0 && !pending[0].at.After(now) {
			win += pending[0].n
			if !pending[0].at.Before(half) {
				late += uint64(pending[0].n)
			}
			p.adjusted(pending[0].n, pending[0].at)
			pending = pending[1:]
		}
		for win > p.hold() && win-p.hold() >= pkt && (sent == acked || sent-acked+pkt <= cwnd) {
			win -= pkt
			sent += pkt
			p.reserved(pkt, now)
			at := now.Add(rtt(now))
			if next := consumed.Add(time.Duration(float64(pkt) / rate(now) * float64(time.Second))); next.After(at) {
				at = next
			}
			consumed = at
			tcpAcks = append(tcpAcks, at)
			owed += pkt
			if owed >= step {
				at = maxTime(at, last) // in order
				last = at
				pending = append(pending, ack{at, owed})
				owed = 0
			}
		}
		p.limited = true
		now = now.Add(100 * time.Microsecond)
	}
	return late, p
}

func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// pacedShare is what the pacing lets through of what the same link
// carries without it, in the second half of d.
func pacedShare(t *testing.T, rtt func(now time.Time) time.Duration, slowStart bool, step uint32, d time.Duration) float64 {
	t.Helper()
	off, _ := simulateTCP(t, 2<<20, rtt, fast, step, d, false, slowStart)
	on, p := simulateTCP(t, 2<<20, rtt, fast, step, d, true, slowStart)
	t.Logf("step %d KiB: %.1f MB/s paced, %.1f MB/s not; limit %d KiB, off %v, shortest round trip %v",
		step>>10, float64(on)/(d/2).Seconds()/1e6, float64(off)/(d/2).Seconds()/1e6, p.limit>>10, p.off, p.minRTT)
	return float64(on) / float64(off)
}

func TestPacerFollowsALinkWhoseRoundTripGrows(t *testing.T) {
	// A link 250 µs long whose round trip grows to 5 ms after 300 ms
	// (another flow fills a queue on the way), to a peer that could take
	// 1 GB/s: the rate the pacing lets through must not spiral down
	// with the limit (the limit divided by the round trip, times two
	// times the shortest round trip: a tenth of the limit at each step).
	rtt := func(now time.Time) time.Duration {
		if now.Sub(time.Unix(0, 0)) < 300*time.Millisecond {
			return 250 * time.Microsecond
		}
		return 5 * time.Millisecond
	}
	for _, step := range []uint32{32 << 10, 96 << 10, 256 << 10} {
		if share := pacedShare(t, rtt, false, step, 2*time.Second); share < 0.75 {
			t.Errorf("adjustments of %d KiB: the pacing let through %.2f of what the link carries without it", step>>10, share)
		}
	}
}

func TestPacerLeavesAJitteryLinkItsWindow(t *testing.T) {
	// 20 ms away with up to 40 ms more on each packet: data in flight
	// takes from 20 to 60 ms to come back, so twice the rate times the
	// shortest round trip is less than the rate needs.
	// Either with the whole window from the start, or from the start of a
	// TCP connection (slow start): then the rate seen with the whole
	// window is no better than what comes after, and the pacing cuts the
	// limit before the congestion window has grown.
	r := rand.New(rand.NewPCG(1, 2))
	rtt := func(time.Time) time.Duration {
		return 20*time.Millisecond + time.Duration(r.Int64N(int64(40*time.Millisecond)))
	}
	for _, slowStart := range []bool{false, true} {
		for _, step := range []uint32{32 << 10, 96 << 10, 256 << 10} {
			if share := pacedShare(t, rtt, slowStart, step, 4*time.Second); share < 0.75 {
				t.Errorf("adjustments of %d KiB, slow start %v: the pacing let through %.2f of what the link carries without it", step>>10, slowStart, share)
			}
		}
	}
}

// fast is a link that carries 1 GB/s.
func fast(time.Time) float64 { return 1e9 }

func TestPacerHoldsBackFromAPeerThatSlowsDown(t *testing.T) {
	// Beside the sender, a peer that takes 300 MB/s, then a third of it
	// (busier): its rate falls with the limit unchanged, which is no
	// sign that the link needs more in flight.
	rtt := func(time.Time) time.Duration { return 50 * time.Microsecond }
	rate := func(now time.Time) float64 {
		if now.Sub(time.Unix(0, 0)) < 500*time.Millisecond {
			return 300e6
		}
		return 100e6
	}
	for _, step := range []uint32{32 << 10, 96 << 10} {
		_, p := simulateLink(t, 2<<20, rtt, rate, step, 2*time.Second, true)
		if p.off || p.limit > 512<<10 {
			t.Errorf("adjustments of %d KiB: limit %d KiB, off %v, for a peer 50 µs away that slowed down", step>>10, p.limit>>10, p.off)
		}
	}
}

// A channel that sends nothing, or is not paced, does not carry the
// pacing's marks of data in flight (8 KiB): a gateway holds a channel for
// every open session.
func TestPacerMarksOnlyOnceItPaces(t *testing.T) {
	if size := unsafe.Sizeof(window{}); size > 1<<10 {
		t.Errorf("a channel's window takes %d bytes before it sends", size)
	}
	w := &window{Cond: newCond()}
	w.add(64 << 10) // under paceMinWindow: not paced
	if _, err := w.reserve(32 << 10); err != nil {
		t.Fatal(err)
	}
	if w.pace.marks != nil {
		t.Error("an unpaced channel holds the marks")
	}
}
