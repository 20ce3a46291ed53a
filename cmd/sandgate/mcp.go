package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandgate/sandgate/mcpserver"
)

// mcpMain is `sandgate mcp`: an MCP server on stdin/stdout whose tools
// drive the gateway at SANDBOX_API_URL. Logs go to stderr.
func mcpMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	attach := fs.String("session", "", "use this existing session as the default session (never deleted by sandgate mcp)")
	logLevel := fs.String("log-level", "info", "log level on stderr: debug, info, warn, error")
	decisions := fs.Bool("egress-decisions", false, "offer the decide_egress tool, with which the model allows or denies a connection an egressMode \"ask\" session parked (off: only a person decides, through the API or console; list_egress_pending is offered either way)")
	pos, code, done := parseCommandFlags(fs, args, `Usage: sandgate mcp [flags]

An MCP server on stdin and stdout whose tools drive the gateway's REST API
(SANDBOX_API_URL, SANDBOX_API_TOKEN); it logs to stderr.
`, stdout, stderr)
	if done {
		return code
	}
	if len(pos) != 0 {
		fmt.Fprintln(stderr, "usage: sandgate mcp [--api-url URL] [--token T] [--session ID]")
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(stderr, "sandgate mcp: --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// The SDK logs every connection step at info: only its warnings, unless debugging.
	sdkLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: max(level, slog.LevelWarn)}))
	if level <= slog.LevelDebug {
		sdkLog = log
	}
	tc, err := cf.tlsConfig()
	if err != nil {
		fmt.Fprintln(stderr, "sandgate mcp:", err)
		return 2
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		tr.TLSClientConfig = tc
	}
	defer tr.CloseIdleConnections()
	client := &mcpserver.Client{BaseURL: cf.apiURL, Token: cf.token, HTTP: &http.Client{Transport: tr}}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *attach != "" {
		if _, err := client.GetSession(ctx, *attach); err != nil {
			fmt.Fprintf(stderr, "sandgate mcp: --session %s: %v\n", *attach, err)
			return 1
		}
	}
	srv := mcpserver.New(mcpserver.Options{Client: client, Logger: log, SDKLogger: sdkLog, Attach: *attach, Version: version,
		EgressDecisions: *decisions})
	t := &mcp.IOTransport{Reader: readCloser{stdin}, Writer: writeCloser{stdout}, MaxLineLength: mcpserver.MaxMessageBytes}
	if err := srv.Run(ctx, t); err != nil {
		log.Error("mcp_server_ended", "err", err)
		return 1
	}
	return 0
}

type readCloser struct{ io.Reader }

func (readCloser) Close() error { return nil }

type writeCloser struct{ io.Writer }

func (writeCloser) Close() error { return nil }
