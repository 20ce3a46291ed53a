// Copyright 2026 The sandgate Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package ssh

import (
	"testing"
	"time"
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
