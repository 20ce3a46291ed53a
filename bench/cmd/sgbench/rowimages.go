package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// --- row 8: sessions on OCI images (sandgate only) ---------------------------
//
// 8a create -> first command on a cached image, alternating with the same
//    on `default` on the same gateway (row 5's method);
// 8b the first pull of a busybox + 50 MB image from a registry on loopback:
//    a create that waits for the on-demand pull, and `sandgate image pull`;
// 8c disk used per session by N sessions on one image (du of the data dir).
//
// OpenSSH has no images: the sshd columns stay empty.

const sgOnly = "sandgate only: OpenSSH has no counterpart"

// imageGateway starts a linux-driver gateway that may pull from reg.
func (b *bench) imageGateway(reg *loopRegistry) (*sandgate, error) {
	args := append(append([]string{}, b.cfg.serveArgs...),
		"--image-allow", reg.host+"/*", "--insecure-registry", reg.host)
	g, err := startSandgate(b.cfg.sandgateBin, filepath.Join(b.tmp, "sandgate-images"), "linux", args)
	if err != nil {
		return nil, err
	}
	if g.driver != "linux" {
		g.stop()
		return nil, fmt.Errorf("serve --sandbox linux runs driver %q; images need the linux driver", g.driver)
	}
	return g, nil
}

func (b *bench) rowImages() error {
	r := b.report
	skip := func(why string) {
		for _, id := range []string{"8a", "8b", "8c"} {
			if b.cfg.wantRow(id) {
				r.add(&Row{ID: id, Name: "sessions on OCI images", Skipped: why})
			}
		}
	}
	base, err := busyboxLayer()
	if err != nil {
		skip(err.Error())
		return nil
	}
	small, err := benchImage(base)
	if err != nil {
		return err
	}
	reg := newLoopRegistry()
	defer reg.close()
	smallRef, err := reg.push("sgbench/busybox:1", small)
	if err != nil {
		return err
	}
	g, err := b.imageGateway(reg)
	if err != nil {
		skip(err.Error())
		return nil
	}
	defer g.stop()
	if b.cfg.wantRow("8a") {
		if err := b.imageCreate(g, smallRef); err != nil {
			return fmt.Errorf("8a: %w", err)
		}
	}
	if b.cfg.wantRow("8b") {
		if err := b.imagePull(g, reg, base); err != nil {
			return fmt.Errorf("8b: %w", err)
		}
	}
	if b.cfg.wantRow("8c") {
		if err := b.imageDisk(g, smallRef); err != nil {
			return fmt.Errorf("8c: %w", err)
		}
	}
	return nil
}

func pickPhase(ps []phases, f func(phases) float64) *Stats {
	xs := make([]float64, len(ps))
	for i, p := range ps {
		xs[i] = f(p)
	}
	return NewStats(xs)
}

// imageCreate is row 5's create -> first command, on the image and on
// `default`, alternating on one gateway.
func (b *bench) imageCreate(g *sandgate, ref string) error {
	// The first create pulls the image; the warm-up runs after it.
	for i := 0; i < 3; i++ {
		for _, img := range []string{ref, ""} {
			if _, err := b.createFirstOn(g, img); err != nil {
				return err
			}
		}
	}
	var on, def []phases
	for i := 0; i < b.cfg.createN; i++ {
		order := []string{ref, ""}
		if i%2 == 1 {
			order = []string{"", ref}
		}
		for _, img := range order {
			p, err := b.createFirstOn(g, img)
			if err != nil {
				return err
			}
			if img == "" {
				def = append(def, p)
			} else {
				on = append(on, p)
			}
		}
	}
	total := func(p phases) float64 { return p.total }
	onT, defT := pickPhase(on, total), pickPhase(def, total)
	via := "REST + CONNECT + SSH + exec (Go client)"
	r := b.report
	name := "session create → first command done, cached image (busybox, 1 layer), `linux` driver"
	dname := "session create → first command done, `default` (no image), same gateway, alternating with the row above"
	note := fmt.Sprintf("%s; p50 image/default = %.2f", sgOnly, onT.Median/defT.Median)
	r.add(&Row{ID: "8a", Name: name, Stat: "p50", Unit: "s", SG: onT, SGName: via, Note: note})
	r.add(&Row{ID: "8a", Name: name, Stat: "p99", Unit: "s", SG: onT, SGName: via, Note: sgOnly})
	r.add(&Row{ID: "8a", Name: dname, Stat: "p50", Unit: "s", SG: defT, SGName: via, Note: sgOnly})
	r.add(&Row{ID: "8a", Name: dname, Stat: "p99", Unit: "s", SG: defT, SGName: via, Note: sgOnly})
	for _, x := range []struct {
		label string
		ps    []phases
	}{{"image", on}, {"default", def}} {
		r.Extra = append(r.Extra,
			&Row{ID: "8a", Name: "… " + x.label + ": of which REST `POST /v1/sessions`", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.create })},
			&Row{ID: "8a", Name: "… " + x.label + ": of which CONNECT + SSH handshake + auth", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.connect })},
			&Row{ID: "8a", Name: "… " + x.label + ": of which exec `true`", Stat: "p50", Unit: "s", SG: pickPhase(x.ps, func(p phases) float64 { return p.exec })},
		)
	}
	return nil
}

// image runs `sandgate image ARGS --data-dir dataDir`.
func (b *bench) image(dataDir string, args ...string) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.sandgateBin, append(append([]string{"image"}, args...), "--data-dir", dataDir)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + b.client, "LANG=C.UTF-8"}
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return d, string(out), fmt.Errorf("sandgate image %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return d, string(out), nil
}

// forget removes ref from g's store and prunes its layers, so that the
// next create pulls it again. A session that just ended may still hold it
// for a moment.
func (b *bench) forget(g *sandgate, ref string) error {
	data := filepath.Join(g.dir, "data")
	var err error
	for i := 0; i < 50; i++ {
		var out string
		if _, out, err = b.image(data, "rm", ref); err == nil {
			break
		}
		if strings.Contains(out, "not found") {
			err = nil
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	_, _, err = b.image(data, "prune")
	return err
}

// imagePull times the first pull of busybox + a random layer of
// cfg.pullSize: a create that waits for the on-demand pull (then the first
// command), and `sandgate image pull` into a fresh data dir, alternating.
func (b *bench) imagePull(g *sandgate, reg *loopRegistry, base v1.Layer) error {
	big, err := randomLayer("data/blob", int(b.cfg.pullSize), uint64(time.Now().UnixNano()))
	if err != nil {
		return err
	}
	img, err := benchImage(base, big)
	if err != nil {
		return err
	}
	ref, err := reg.push("sgbench/big:1", img)
	if err != nil {
		return err
	}
	var blobBytes int64
	for _, l := range []v1.Layer{base, big} {
		n, err := l.Size()
		if err != nil {
			return err
		}
		blobBytes += n
	}
	var first []float64
	viaCreate := func() (float64, error) {
		if err := b.forget(g, ref); err != nil {
			return 0, err
		}
		p, err := b.createFirstOn(g, ref)
		first = append(first, p.total)
		return p.create, err
	}
	n := 0
	viaCLI := func() (float64, error) {
		n++
		dir := filepath.Join(b.tmp, fmt.Sprintf("image-pull-%d", n))
		defer os.RemoveAll(dir)
		d, _, err := b.image(dir, "pull", "--insecure", ref)
		return d.Seconds(), err
	}
	sc, sp, err := alternate(b.cfg.pullReps, viaCreate, viaCLI)
	if err != nil {
		return err
	}
	if err := b.forget(g, ref); err != nil { // 8c measures without it
		return err
	}
	name := fmt.Sprintf("first pull of busybox + %s random layer from a loopback registry (go-containerregistry, plain HTTP)", sizeLabel(b.cfg.pullSize))
	blob := formatValue(float64(blobBytes), "B")
	r := b.report
	r.add(&Row{ID: "8b", Name: name + ": create that waits for the on-demand pull", Stat: "median", Unit: "s",
		SG: NewStats(sc), Bytes: blobBytes, SGName: "`POST /v1/sessions {\"image\": REF}` → 201",
		Note: fmt.Sprintf("%s; %s of blobs (throughput over them); create → first command done: %s median; the image is removed and pruned (`sandgate image rm`, `prune`) before each run",
			sgOnly, blob, formatValue(NewStats(first).Median, "s"))})
	r.add(&Row{ID: "8b", Name: name + ": `sandgate image pull`", Stat: "median", Unit: "s",
		SG: NewStats(sp), Bytes: blobBytes, SGName: "CLI process, fresh data dir",
		Note: fmt.Sprintf("%s; %s of blobs; includes the process start", sgOnly, blob)})
	return nil
}

// imageDisk creates cfg.imageSessions sessions on ref and reports how much
// the data dir grows per session: allocated blocks (du -x) of
// <data>/sandboxes plus <data>/images/refs. The same for `default`
// sessions, for comparison.
func (b *bench) imageDisk(g *sandgate, ref string) error {
	n := b.cfg.imageSessions
	data := filepath.Join(g.dir, "data")
	// The image is stored before the baseline.
	if _, err := b.createFirstOn(g, ref); err != nil {
		return err
	}
	type usage struct{ sbx, sbxApp, refs, ws, wsApp int64 }
	measure := func() (usage, error) {
		var u usage
		var err error
		if u.sbx, u.sbxApp, err = diskUsage(filepath.Join(data, "sandboxes")); err != nil {
			return u, err
		}
		if u.refs, _, err = diskUsage(filepath.Join(data, "images", "refs")); err != nil {
			return u, err
		}
		ws, _ := filepath.Glob(filepath.Join(data, "sandboxes", "*", "workspace.img"))
		for _, p := range ws {
			var st os.FileInfo
			if st, err = os.Lstat(p); err == nil {
				a, _, _ := diskUsage(p)
				u.ws += a
				u.wsApp += st.Size()
			}
		}
		return u, nil
	}
	run := func(image string) (per usage, err error) {
		before, err := measure()
		if err != nil {
			return per, err
		}
		sess := make([]*session, n)
		defer func() {
			_ = parallel(n, 8, func(i int) error {
				if sess[i] != nil {
					g.delete(sess[i].ID)
				}
				return nil
			})
		}()
		if err := parallel(n, 8, func(i int) error {
			s, err := g.createOn(b.ctx, image)
			sess[i] = s
			return err
		}); err != nil {
			return per, fmt.Errorf("create %d sessions: %w", n, err)
		}
		after, err := measure()
		if err != nil {
			return per, err
		}
		d := func(a, b int64) int64 { return (a - b) / int64(n) }
		return usage{d(after.sbx, before.sbx), d(after.sbxApp, before.sbxApp), d(after.refs, before.refs),
			d(after.ws, before.ws), d(after.wsApp, before.wsApp)}, nil
	}
	on, err := run(ref)
	if err != nil {
		return err
	}
	def, err := run("")
	if err != nil {
		return err
	}
	layers, _, err := diskUsage(filepath.Join(data, "images", "layers"))
	if err != nil {
		return err
	}
	one := func(v int64) *Stats { return NewStats([]float64{float64(v)}) }
	f := func(v int64) string { return formatValue(float64(v), "B") }
	r := b.report
	r.add(&Row{ID: "8c", Name: fmt.Sprintf("disk per session, %d sessions on one image (busybox), idle", n), Stat: "value", Unit: "B",
		SG: one(on.sbx + on.refs), SGName: "growth of du -x <data>/sandboxes + <data>/images/refs, / sessions",
		Note: fmt.Sprintf("%s; allocated blocks, not apparent size: of which workspace.img %s allocated (ext4 metadata; sparse, %s apparent, its size is `--sandbox-workspace-size`), the rest (sandbox dir, state) %s, image ref %s; plus what a session writes; the image's layers (%s) are shared by all; `default` sessions: %s each, so an image adds %s",
			sgOnly, f(on.ws), f(on.wsApp), f(on.sbx-on.ws), f(on.refs), f(layers), f(def.sbx+def.refs), f(on.sbx+on.refs-def.sbx-def.refs))})
	r.Extra = append(r.Extra,
		&Row{ID: "8c", Name: "… of which the workspace image (ext4, sparse), allocated", Stat: "value", Unit: "B", SG: one(on.ws)},
		&Row{ID: "8c", Name: fmt.Sprintf("… `default` sessions, %d, same measure", n), Stat: "value", Unit: "B", SG: one(def.sbx + def.refs)},
		&Row{ID: "8c", Name: "… an image session over a `default` one", Stat: "value", Unit: "B", SG: one(on.sbx + on.refs - def.sbx - def.refs)},
		&Row{ID: "8c", Name: "… image layers on disk, once for all sessions", Stat: "value", Unit: "B", SG: one(layers)},
	)
	return nil
}

// sizeLabel is n in MB when it is a whole number of them (50 MB), else in
// KiB or MiB.
func sizeLabel(n int64) string {
	if n%1e6 == 0 && n%(1<<20) != 0 {
		return fmt.Sprintf("%d MB", n/1e6)
	}
	return formatValue(float64(n), "B")
}
