package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sandgate/sandgate/images"
)

const imageUsage = `Usage: sandgate image COMMAND [flags] ARGS

Manage the container images sandboxes start from, in the gateway's data dir.
Safe to run while sandgate serve uses the same data dir.

Commands:
  pull [--insecure] [--json] REF
                                pull REF (python:3.12-slim, ghcr.io/acme/tool@sha256:...) from its
                                registry; credentials from ~/.docker/config.json. A progress bar on
                                a terminal; --json prints progress as JSON lines
  import --name NAME PATH       import an OCI image layout dir, an oci-archive or a docker save tar
  ls [--json]                   list stored images
  rm [--force] NAME...          remove images (refused while a session uses one, unless --force);
                                their layers stay until prune
  prune                         delete layers no stored image and no session uses

Every command takes --data-dir (default: serve's, $XDG_STATE_HOME/sandgate or ~/.local/state/sandgate).
`

// imageMain runs `sandgate image ...`.
func imageMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, imageUsage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, imageUsage)
		return 0
	case "pull", "import", "ls", "list", "rm", "remove", "prune":
	default:
		printUsageError(stderr, "image", fmt.Errorf("unknown command %q", args[0]))
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("image "+cmd, flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir(), "the gateway's data dir")
	insecure, force, asJSON := new(bool), new(bool), new(bool)
	nameFlag := new(string)
	nargs := "none"
	synopsis := map[string]string{
		"pull": "pull [flags] REF", "import": "import --name NAME [flags] PATH", "ls": "ls [flags]", "list": "ls [flags]",
		"rm": "rm [flags] NAME...", "remove": "rm [flags] NAME...", "prune": "prune [flags]",
	}[cmd]
	switch cmd {
	case "pull":
		fs.BoolVar(insecure, "insecure", false, "allow plain HTTP (or HTTPS without certificate checks) for this registry")
		fs.BoolVar(asJSON, "json", false, "print progress and the result as JSON lines on stdout")
		nargs = "one"
	case "import":
		fs.StringVar(nameFlag, "name", "", "the name to store the image under (required)")
		nargs = "one"
	case "ls", "list":
		fs.BoolVar(asJSON, "json", false, "print JSON")
	case "rm", "remove":
		fs.BoolVar(force, "force", false, "remove even while sessions use the image")
		nargs = "some"
	}
	pos, code, done := parseCommandFlags(fs, args[1:], "Usage: sandgate image "+synopsis+"\n\nRun 'sandgate image --help' for what each command does.\n", stdout, stderr)
	if done {
		return code
	}
	switch {
	case nargs == "none" && len(pos) != 0, nargs == "one" && len(pos) != 1, nargs == "some" && len(pos) == 0:
		printUsageError(stderr, fs.Name(), fmt.Errorf("wrong number of arguments (usage: sandgate image %s)", synopsis))
		return 2
	}
	if cmd == "import" && *nameFlag == "" {
		printUsageError(stderr, fs.Name(), errors.New("--name is required"))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sandgate image %s: %v\n", cmd, err)
		return 1
	}
	// The operator's own pulls have no overall deadline (Ctrl-C ends one),
	// only the stall timeout; the store's quota and reserve apply.
	store, err := images.Open(*dataDir, images.WithPullTimeouts(-1, 0))
	if err != nil {
		return fail(err)
	}
	// An interrupted pull or import cleans up before exiting.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch cmd {
	case "pull":
		return imagePull(ctx, store, pos[0], *insecure, *asJSON, stdout, stderr)
	case "import":
		img, err := store.Import(ctx, *nameFlag, pos[0])
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "imported %s (%s, %d layers, %s)\n", img.Name, img.Digest, len(img.LayerDirs), humanSize(img.SizeBytes))
	case "ls", "list":
		return imageList(store, *asJSON, stdout, stderr)
	case "rm", "remove":
		code := 0
		for _, n := range pos {
			img, err := store.Remove(n, *force)
			if errors.Is(err, images.ErrInUse) {
				fmt.Fprintf(stderr, "sandgate image rm: %v (--force removes it anyway)\n", err)
				code = 1
				continue
			}
			if err != nil {
				fmt.Fprintf(stderr, "sandgate image rm: %v\n", err)
				code = 1
				continue
			}
			fmt.Fprintf(stdout, "removed %s (%s)\n", img.Name, img.Digest)
		}
		if code == 0 {
			fmt.Fprintln(stdout, "run `sandgate image prune` to delete layers no image uses")
		}
		return code
	case "prune":
		res, err := store.Prune()
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "pruned %d layers, freed %s\n", len(res.Layers), humanSize(res.Bytes))
	}
	return 0
}

// imagePull pulls ref, showing its progress: JSON lines on stdout with
// asJSON, else a bar on stderr when stderr is a terminal.
func imagePull(ctx context.Context, store *images.Store, ref string, insecure, asJSON bool, stdout, stderr io.Writer) int {
	start := time.Now()
	enc := json.NewEncoder(stdout)
	var progress func(images.Progress)
	var bar *progressBar
	switch {
	case asJSON:
		progress = func(p images.Progress) {
			_ = enc.Encode(struct {
				Status string `json:"status"`
				Ref    string `json:"ref"`
				images.Progress
			}{"pulling", ref, p})
		}
	case isTerminalWriter(stderr):
		bar = &progressBar{w: stderr, label: ref}
		progress = bar.update
	}
	img, err := store.Pull(ctx, ref, images.PullOptions{Insecure: insecure, Progress: progress})
	if bar != nil {
		bar.end()
	}
	if err != nil {
		if asJSON {
			_ = enc.Encode(map[string]string{"status": "failed", "ref": ref, "error": err.Error()})
		}
		fmt.Fprintf(stderr, "sandgate image pull: %v\n", err)
		return 1
	}
	took := time.Since(start).Round(10 * time.Millisecond)
	if asJSON {
		_ = enc.Encode(map[string]any{"status": "pulled", "ref": ref, "name": img.Name, "digest": img.Digest,
			"layers": len(img.LayerDirs), "sizeBytes": img.SizeBytes, "seconds": took.Seconds()})
		return 0
	}
	fmt.Fprintf(stdout, "pulled %s (%s, %d layers, %s) in %s\n", img.Name, img.Digest, len(img.LayerDirs),
		humanSize(img.SizeBytes), took)
	return 0
}

// isTerminalWriter reports whether w is a terminal's file.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

// progressBar draws a pull's progress on one terminal line.
type progressBar struct {
	w     io.Writer
	label string
	drawn bool
}

func (b *progressBar) update(p images.Progress) {
	const width = 30
	frac := 1.0
	if p.Total > 0 {
		frac = float64(p.Complete) / float64(p.Total)
	}
	n := int(frac * width)
	fmt.Fprintf(b.w, "\r%s [%s%s] %3.0f%% %s / %s, %d layers ", b.label, strings.Repeat("=", n), strings.Repeat(" ", width-n),
		frac*100, humanSize(p.Complete), humanSize(p.Total), p.Layers)
	b.drawn = true
}

func (b *progressBar) end() {
	if b.drawn {
		fmt.Fprintln(b.w)
	}
}

func imageList(store *images.Store, asJSON bool, stdout, stderr io.Writer) int {
	imgs, err := store.List()
	if err != nil {
		fmt.Fprintf(stderr, "sandgate image ls: %v\n", err)
		return 1
	}
	refs, err := store.Refs()
	if err != nil {
		fmt.Fprintf(stderr, "sandgate image ls: %v\n", err)
		return 1
	}
	users := map[string]int{}
	for _, r := range refs {
		if !r.Warm { // a warm sandbox no session has claimed yet is the gateway's
			users[r.Digest]++
		}
	}
	if asJSON {
		type entry struct {
			images.Image
			Sessions int `json:"sessions"`
		}
		out := make([]entry, 0, len(imgs))
		for _, img := range imgs {
			out = append(out, entry{img, users[img.Digest]})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIGEST\tLAYERS\tSIZE\tPULLED\tSESSIONS")
	for _, img := range imgs {
		d := img.Digest
		if len(d) > len("sha256:")+12 {
			d = d[:len("sha256:")+12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\n", img.Name, d, len(img.LayerDirs), humanSize(img.SizeBytes),
			img.PulledAt.Local().Format("2006-01-02 15:04"), users[img.Digest])
	}
	tw.Flush()
	return 0
}

// humanSize is n in decimal units, as docker shows sizes.
func humanSize(n int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB"}
	f := float64(n)
	i := 0
	for f >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", f), "0"), ".") + " " + units[i]
}
