package main

import (
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// The reference responder answers an A query with one record, and the
// client's output parses.
func TestDNSResponder(t *testing.T) {
	d, err := newDNSResponder()
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	c, err := net.Dial("udp", d.pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	q = append(q, 1, 'q', 3, 'b', 'i', 'g', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	a := make([]byte, 512)
	n, err := c.Read(a)
	if err != nil {
		t.Fatal(err)
	}
	a = a[:n]
	if binary.BigEndian.Uint16(a[:2]) != 0x1234 || a[2]&0x80 == 0 || a[3]&0x0f != 0 || binary.BigEndian.Uint16(a[6:8]) != 1 {
		t.Fatalf("answer header % x", a[:12])
	}
	if ip := a[len(a)-4:]; net.IP(ip).String() != "198.18.0.2" {
		t.Errorf("A record %v", net.IP(ip))
	}
	if dnsAnswer([]byte{1, 2, 3}) != nil || dnsAnswer(q[:14]) != nil {
		t.Error("answered a truncated query")
	}
	if xs, err := parseNanos([]byte("1000 2000000\n")); err != nil || len(xs) != 2 || xs[1] != 0.002 {
		t.Errorf("parseNanos: %v %v", xs, err)
	}
}
