package rest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Logs bounds: lines per section.
const (
	DefaultLogTail = 100
	MaxLogTail     = 10000
)

// logTailBytes is how much of a process's output, from its end, the last
// lines are looked for in.
const logTailBytes = 1 << 20

// sessionLogs serves GET /v1/sessions/{id}/logs?tail=N as text: the last
// N commands of the session's history, then for each background process
// the last N lines of its output (stdout and stderr as they arrived). A
// failed session's logs can still be read.
func (a *api) sessionLogs(w http.ResponseWriter, r *http.Request) {
	tail, err := queryInt(r, "tail", DefaultLogTail, 1, MaxLogTail)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_tail", err.Error())
		return
	}
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	s.Touch(time.Now())
	var b strings.Builder
	writeHistory(&b, s.History(), tail)
	for _, info := range a.dp.Processes.List(s.ID) {
		pr, ok := a.dp.Processes.Get(s.ID, info.ProcessID)
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "\n== process %s (%s): %s ==\n", info.ProcessID, processState(info), oneLine(info.Command))
		for _, l := range outputTail(r.Context(), pr.Output(), tail) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, b.String())
}

// writeHistory writes the last tail records of hist, one a line: time,
// source, exit, command.
func writeHistory(b *strings.Builder, hist []gateway.CommandRecord, tail int) {
	shown := hist[max(0, len(hist)-tail):]
	fmt.Fprintf(b, "== commands (last %d of %d) ==\n", len(shown), len(hist))
	for _, c := range shown {
		exit := "exit=?"
		switch {
		case c.ExitCode != nil:
			exit = fmt.Sprintf("exit=%d", *c.ExitCode)
		case c.ExitSignal != "":
			exit = "signal=" + c.ExitSignal
		}
		if c.TimedOut {
			exit += " timed-out"
		}
		fmt.Fprintf(b, "%s %s %s %dms %s\n", c.StartedAt.UTC().Format(time.RFC3339Nano), c.Source, exit, c.DurationMs, oneLine(c.Command))
	}
}

// processState is a process's status for its heading.
func processState(info dataplane.ProcessInfo) string {
	switch {
	case info.ExitCode != nil:
		return fmt.Sprintf("%s, exit=%d", info.Status, *info.ExitCode)
	case info.ExitSignal != "":
		return fmt.Sprintf("%s, signal=%s", info.Status, info.ExitSignal)
	}
	return info.Status
}

// oneLine keeps a command on one line of the log.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ⏎ ", "\n", " ⏎ ", "\r", " ⏎ ").Replace(s)
}

// outputTail returns the last n lines of out, looked for in its last
// logTailBytes: a first line cut by that bound is left out.
func outputTail(ctx context.Context, out *dataplane.OutputLog, n int) []string {
	end := out.End()
	from := max(out.Start(), end-logTailBytes)
	rd := out.NewReader(from)
	var buf strings.Builder
	cut := from > 0
	for {
		c, err := rd.Next(ctx, false)
		if err != nil {
			break
		}
		if c.Dropped > 0 {
			cut = true
			continue
		}
		if c.Offset >= end { // what came after we began: not waited for
			break
		}
		buf.Write(c.Data[:min(int64(len(c.Data)), end-c.Offset)])
	}
	text := strings.ToValidUTF8(buf.String(), "\uFFFD")
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	if cut && len(lines) > 1 {
		lines = lines[1:]
	}
	return lines[max(0, len(lines)-n):]
}
