package gateway_test

import (
	"context"
	"io"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// TestStartOptions: what Session.Start records is what its options say,
// and nothing else steers it: no context value, no wrapper.
func TestStartOptions(t *testing.T) {
	met := &recMetrics{}
	m, _ := newManager(t, gateway.Config{Metrics: met})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	start := func(command string, o gateway.StartOptions) {
		t.Helper()
		p, err := s.Start(context.Background(), sandbox.Cmd{Command: command}, o)
		if err != nil {
			t.Fatalf("start %q: %v", command, err)
		}
		_ = p.Stdin().Close()
		go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
		_, _ = io.Copy(io.Discard, p.Stdout())
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	start("echo rest", gateway.StartOptions{Resume: true, Record: true, Source: "rest"})
	start("echo unlisted", gateway.StartOptions{Resume: true})
	start("echo ssh", gateway.SSHStart)
	// Session.Sandbox() starts as SSH does.
	p, err := s.Sandbox().Start(context.Background(), sandbox.Cmd{Command: "echo wrapped"})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Stdin().Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	_, _ = io.Copy(io.Discard, p.Stdout())
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	// A caller that records its command itself goes the same way.
	s.RecordCommand(context.Background(), gateway.CommandRecord{Command: "echo own", Source: "rest", Shell: "sh1"})

	var got []string
	for _, r := range s.History() {
		got = append(got, r.Source+":"+r.Command)
	}
	want := []string{"rest:echo rest", "ssh:echo ssh", "ssh:echo wrapped", "rest:echo own"}
	if len(got) != len(want) {
		t.Fatalf("history %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("history %q, want %q", got, want)
		}
	}
	for i, r := range s.History()[:3] {
		if r.ExitCode == nil || *r.ExitCode != 0 || r.BytesOut == 0 {
			t.Errorf("history[%d] = %+v: want exit 0 and its output counted", i, r)
		}
	}
	met.mu.Lock()
	defer met.mu.Unlock()
	if len(met.commands) != 4 {
		t.Errorf("commands counted %v, want the history's 4", met.commands)
	}
}
