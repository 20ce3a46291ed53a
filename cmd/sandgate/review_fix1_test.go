package main

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A streamed command's answer begins (its headers go) as soon as the
// command runs, not with its first output: a client that bounds its wait
// for the headers (the TypeScript SDK's timeoutMs) must not kill a
// command that is quiet for longer, in a persistent shell too.
func TestStreamedCommandHeadersBeforeOutput(t *testing.T) {
	g := startGateway(t)
	logOnFailure(t, g)
	id := g.createSession(t).SessionID
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 2 * time.Second}}
	for _, body := range []string{`{"command": "sleep 5; echo done"}`, `{"command": "sleep 5; echo done", "shell": "quiet"}`} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+g.Token)
		req.Header.Set("Accept", "application/x-ndjson")
		res, err := client.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: the headers did not come before the first output: %v", body, err)
		}
		var lines []string
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		res.Body.Close()
		cancel()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/x-ndjson") ||
			len(lines) != 2 || lines[0] != `{"stdout":"done\n"}` || !strings.Contains(lines[1], `"exitCode":0`) {
			t.Errorf("%s: %d %q %q", body, res.StatusCode, res.Header.Get("Content-Type"), lines)
		}
	}
}
