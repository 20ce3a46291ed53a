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

// TestReportLater: a recorded command whose caller reports it later
// (an SSH exec, which answers its client first) is in the history when
// Wait returns, and counted only once the report is made; a process Start
// did not record has nothing to report.
func TestReportLater(t *testing.T) {
	met := &recMetrics{}
	m, _ := newManager(t, gateway.Config{Metrics: met})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	counted := func() int {
		met.mu.Lock()
		defer met.mu.Unlock()
		return len(met.commands)
	}
	run := func(command string, o gateway.StartOptions) (report func()) {
		t.Helper()
		p, err := s.Start(context.Background(), sandbox.Cmd{Command: command}, o)
		if err != nil {
			t.Fatalf("start %q: %v", command, err)
		}
		report = gateway.ReportLater(p)
		_ = p.Stdin().Close()
		go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
		_, _ = io.Copy(io.Discard, p.Stdout())
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		return report
	}
	report := run("exit 4", gateway.SSHStart)
	h := s.History()
	if len(h) != 1 || h[0].Command != "exit 4" || h[0].ExitCode == nil || *h[0].ExitCode != 4 {
		t.Fatalf("history after Wait %+v, want the command with its status", h)
	}
	if n := counted(); n != 0 {
		t.Fatalf("%d commands counted before the report", n)
	}
	report()
	report() // once only
	if n := counted(); n != 1 {
		t.Fatalf("%d commands counted after the report, want 1", n)
	}
	run("echo unlisted", gateway.StartOptions{Resume: true})()
	if n, h := counted(), s.History(); n != 1 || len(h) != 1 {
		t.Fatalf("an unrecorded command was counted (%d) or listed (%+v)", n, h)
	}
}
