// Copyright 2026 The sandgate Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package ssh

import (
	"time"
)

// Pacing of channel data (sandgate). A sender may put as much data in
// flight as the peer's window allows, and upstream does. When the peer
// takes the data in faster than the link can carry it, that is what keeps
// the link full. When the peer itself is the bottleneck (a client on the
// same host, busy with its own decryption and with the process it feeds),
// the data beyond what the link needs only waits in the peer's buffers:
// OpenSSH's ssh then grows a channel's buffer up to the whole window (2 MiB)
// one packet at a time, each step a new allocation, a copy of everything
// so far and faults on fresh pages. An sftp get of 64 MiB from a gateway on
// the same host cost its ssh 40-60 thousand page faults and a third more
// CPU than the same get from sshd, which, slower, never filled the window.
//
// So a channel's sender keeps its data in flight (sent and not yet given
// back by a window adjustment) near what the link needs: twice the rate at
// which the peer gives window back, times the shortest time it has taken
// to give back a byte sent (the link's round trip plus the peer's own
// processing when it had nothing queued). A link that needs the whole
// window gets it: the rate it reaches with less is the limit divided by the
// round trip, so the limit doubles each time it is measured, up to the
// window.
//
// The limit never goes below twice the largest of the peer's last
// adjustments (and 128 KiB): a peer that gives window back only in steps
// of some size, or once half of it is used up, still has the room to
// take the next step. A peer that has not given any back for paceStall
// while the limit (not its window) held the sender back turns the pacing
// off for the channel. Until the peer's first adjustment, nothing is
// paced.
//
// The rule holds only while the round trip stays near its shortest: the
// rate the limit lets through is the limit divided by the round trip, so
// where the round trip is more than twice its shortest (a queue on the
// way that another flow filled, a jittery link) the limit it sets is
// below the one it had, each measure takes it lower, down to the floor,
// and a limit set for a near peer stays there when the link gets longer.
// The rate alone does not tell such a link from a peer that is the
// bottleneck (either way, it is what is in flight divided by the time it
// takes to come back); what tells them apart is what the rate does when
// the limit moves. So every paceProbeEvery spans of at least paceProbe
// (and four shortest round trips) in which the limit held the sender
// back, the sender lets twice as much in flight for such a span: if the
// rate rises by half, the link, not the peer, needed it, and the pacing
// is turned off for the channel.
type pacer struct {
	started bool   // the first window (the channel's open) was seen
	init    uint32 // the peer's window at the channel's open
	limit   uint32 // data in flight allowed; the whole window while off
	off     bool

	sent, acked uint64               // bytes reserved, and window given back after init
	marks       *[paceMarks]paceMark // from the first send paced: 8 KiB
	head, n     int                  // the marks not yet given back, oldest at head

	// steps are the sizes of the last adjustments: a peer that gives
	// window back in steps of at least some size gives back each of
	// them, so the limit stays above twice the largest.
	steps [paceSteps]uint32
	step  int

	// limited is set when the sender wanted to send more than the limit
	// or the window let it, since the current rate interval began: only
	// then does the rate say what the peer can take, and may the limit
	// come down (a sender with little to send says nothing of it).
	limited bool

	minRTT    time.Duration // shortest time from a send to its adjustment
	rateAt    time.Time     // the start of the current rate interval
	rateAcked uint64        // acked at rateAt

	// spanAt and spanAcked start the current span in which the sender
	// was held back (zero: none); spans counts those spans since the
	// last probe; while probing (the limit doubled from probeLimit),
	// probeRate is the rate over the span before.
	spanAt     time.Time
	spanAcked  uint64
	spans      int
	probing    bool
	probeLimit uint32
	probeRate  float64

	// stall is armed while a writer waits on the limit alone; it turns
	// the pacing off unless an adjustment comes first.
	stall   *time.Timer
	adjusts uint64 // adjustments so far, to tell whether one came since
}

type paceMark struct {
	end uint64 // sent after this send
	at  time.Time
}

const (
	paceMarks = 256
	paceSteps = 16
	// paceFloor is the lowest limit.
	paceFloor = 128 << 10
	// paceInterval is the shortest span over which the rate at which the
	// peer gives window back is measured.
	paceInterval = 5 * time.Millisecond
	// paceMinWindow: windows smaller than this are not paced.
	paceMinWindow = 256 << 10
	// paceStall: a writer held back by the limit alone for this long,
	// without an adjustment, turns the pacing off for the channel.
	paceStall = 50 * time.Millisecond
	// paceProbe is the shortest span over which the rate is compared with
	// twice the limit and without; paceProbeEvery is how many such spans
	// the limit holds the sender back for between two probes.
	paceProbe      = 50 * time.Millisecond
	paceProbeEvery = 4
)

// opened records the peer's initial window.
func (p *pacer) opened(win uint32) {
	p.started = true
	p.init, p.limit = win, win
	p.off = win < paceMinWindow
}

// hold is how much of the peer's window the sender leaves unused now.
func (p *pacer) hold() uint32 {
	if p.off || p.limit >= p.init {
		return 0
	}
	return p.init - p.limit
}

// reserved records n bytes sent now.
func (p *pacer) reserved(n uint32, now time.Time) {
	if p.off || n == 0 {
		return
	}
	p.sent += uint64(n)
	if p.marks == nil {
		p.marks = new([paceMarks]paceMark)
	}
	if p.n == paceMarks { // too many small sends in flight: merge into the newest
		p.marks[(p.head+p.n-1)%paceMarks].end = p.sent
		return
	}
	p.marks[(p.head+p.n)%paceMarks] = paceMark{end: p.sent, at: now}
	p.n++
}

// adjusted records n bytes of window given back now, and sets the limit.
func (p *pacer) adjusted(n uint32, now time.Time) {
	p.adjusts++
	if p.off {
		return
	}
	p.acked += uint64(n)
	p.steps[p.step] = n
	p.step = (p.step + 1) % paceSteps
	var last time.Time
	for p.n > 0 && p.marks[p.head].end <= p.acked {
		last = p.marks[p.head].at
		p.head = (p.head + 1) % paceMarks
		p.n--
	}
	if !last.IsZero() {
		if rtt := now.Sub(last); p.minRTT == 0 || rtt < p.minRTT {
			p.minRTT = max(rtt, time.Microsecond)
		}
	}
	if p.rateAt.IsZero() {
		p.rateAt, p.rateAcked = now, p.acked
		return
	}
	span := now.Sub(p.rateAt)
	if span < max(paceInterval, p.minRTT) || p.minRTT == 0 {
		return
	}
	rate := float64(p.acked-p.rateAcked) / span.Seconds()
	limited := p.limited
	base := p.limit // the limit, the probe's aside
	if p.probing {
		base = p.probeLimit
	}
	if !limited || base >= p.init {
		p.spanAt, p.spans = time.Time{}, 0
		if p.probing {
			p.probing, p.limit = false, p.probeLimit
		}
	} else if p.spanAt.IsZero() {
		p.spanAt, p.spanAcked = p.rateAt, p.rateAcked
	}
	p.rateAt, p.rateAcked, p.limited = now, p.acked, false
	if long := now.Sub(p.spanAt); !p.spanAt.IsZero() && long >= max(paceProbe, 4*p.minRTT) {
		r := float64(p.acked-p.spanAcked) / long.Seconds()
		p.spanAt, p.spanAcked = now, p.acked
		switch {
		case p.probing && r >= p.probeRate*3/2:
			// Twice the limit, half as much again through: the
			// link needs the data in flight.
			p.off, p.limit, p.probing = true, p.init, false
			return
		case p.probing:
			p.probing, p.limit, p.spans = false, p.probeLimit, 0
		default:
			if p.spans++; p.spans >= paceProbeEvery {
				p.probing, p.probeLimit, p.probeRate = true, p.limit, r
				p.limit = uint32(min(uint64(p.init), 2*uint64(p.limit)))
				return
			}
		}
	}
	if p.probing {
		return // the limit stays doubled through the probe
	}
	need := 2 * rate * p.minRTT.Seconds()
	if !limited && need < float64(p.limit) {
		return
	}
	floor := uint64(paceFloor)
	for _, st := range p.steps {
		floor = max(floor, 2*uint64(st)+32<<10)
	}
	if floor >= uint64(p.init) {
		p.limit = p.init
		return
	}
	switch {
	case need >= float64(p.init):
		p.limit = p.init
	case need <= float64(floor):
		p.limit = uint32(floor)
	default:
		p.limit = uint32(need)
	}
}

// armStall starts the stall timer of w's pacer if it is not running; w.L
// is held. Its end wakes the writers, which arm it again if the limit
// still holds them back.
func (w *window) armStall() {
	p := &w.pace
	if p.stall != nil {
		return
	}
	seen := p.adjusts
	p.stall = time.AfterFunc(paceStall, func() {
		w.L.Lock()
		defer w.L.Unlock()
		p.stall = nil
		if p.adjusts == seen {
			p.off = true
		}
		w.Broadcast()
	})
}
