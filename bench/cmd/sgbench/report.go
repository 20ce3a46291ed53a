package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Row is one line of the results table: a workload measured against
// sandgate (SG) and the reference OpenSSH sshd (Ref).
type Row struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Stat is the statistic shown: "median", "p50", "p99" or "value".
	Stat string `json:"stat"`
	// Unit of the samples: "s" (seconds) or "B" (bytes).
	Unit    string `json:"unit"`
	SG      *Stats `json:"sandgate,omitempty"`
	Ref     *Stats `json:"sshd,omitempty"`
	SGName  string `json:"sandgateVia,omitempty"`
	RefName string `json:"sshdVia,omitempty"`
	// RefKind names what the reference column holds when it is not sshd
	// (row 9: "host", no sandbox; row 10: sandgate's own "SSH" or "SFTP");
	// it labels RefName.
	RefKind string `json:"referenceKind,omitempty"`
	// Bytes moved per run, for throughput rows.
	Bytes int64 `json:"bytes,omitempty"`
	// Ratio is sandgate/sshd of the shown statistic: lower is better.
	Ratio   float64  `json:"-"`
	RatioJS *float64 `json:"ratio"`
	// CPU holds median CPU seconds per run for transfer rows:
	// sandgateServer, sandgateClient, sshdServer, sshdClient.
	CPU     map[string]float64 `json:"cpuSeconds,omitempty"`
	Note    string             `json:"note,omitempty"`
	Skipped string             `json:"skipped,omitempty"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	CPU             string `json:"cpu"`
	Cores           int    `json:"cores"`
	MemTotal        string `json:"memTotal"`
	Kernel          string `json:"kernel"`
	OS              string `json:"os"`
	OpenSSHClient   string `json:"opensshClient"`
	OpenSSHServer   string `json:"opensshServer"`
	Go              string `json:"go"`
	Python          string `json:"python,omitempty"`
	Paramiko        string `json:"paramiko,omitempty"`
	SandgateVersion string `json:"sandgateVersion"`
	Commit          string `json:"commit"`
	LoadStart       string `json:"loadavgStart"`
	LoadEnd         string `json:"loadavgEnd"`
	TmpDir          string `json:"tmpDir"`
	TmpFS           string `json:"tmpFs"`
}

// Report is the whole run.
type Report struct {
	Started  time.Time `json:"started"`
	Duration string    `json:"duration"`
	Mode     string    `json:"mode"`
	RefLabel string    `json:"reference"`
	Driver   string    `json:"sandboxDriver"`
	Machine  Machine   `json:"machine"`
	Setup    []string  `json:"setup"`
	Rows     []*Row    `json:"rows"`
	Extra    []*Row    `json:"extra,omitempty"`
	Notes    []string  `json:"notes"`
}

func (r *Report) add(row *Row) *Row {
	r.Rows = append(r.Rows, row)
	return row
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// finish computes the ratios.
func (r *Report) finish() {
	for _, rows := range [][]*Row{r.Rows, r.Extra} {
		for _, row := range rows {
			row.Ratio = math.NaN()
			row.RatioJS = nil
			if row.Skipped != "" || row.SG == nil || row.Ref == nil {
				continue
			}
			row.Ratio = ratio(row.SG.Pick(row.Stat), row.Ref.Pick(row.Stat))
			if !math.IsNaN(row.Ratio) {
				v := math.Round(row.Ratio*1000) / 1000
				row.RatioJS = &v
			}
		}
	}
}

func throughput(bytes int64, secs float64) string {
	if bytes == 0 || secs <= 0 || math.IsNaN(secs) {
		return ""
	}
	return fmt.Sprintf(" (%.0f MB/s)", float64(bytes)/secs/1e6)
}

func (row *Row) cells() (sg, sgSpread, ref, refSpread, rat string) {
	if row.Skipped != "" {
		return "skipped: " + row.Skipped, "", "", "", ""
	}
	sg, ref = "n/a", "n/a"
	if row.SG != nil && row.SG.N > 0 {
		v := row.SG.Pick(row.Stat)
		sg = formatValue(v, row.Unit) + throughput(row.Bytes, v)
		sgSpread = row.SG.Spread(row.Stat, row.Unit)
	}
	if row.Ref != nil && row.Ref.N > 0 {
		v := row.Ref.Pick(row.Stat)
		ref = formatValue(v, row.Unit) + throughput(row.Bytes, v)
		refSpread = row.Ref.Spread(row.Stat, row.Unit)
	}
	rat = "–"
	if !math.IsNaN(row.Ratio) {
		rat = fmt.Sprintf("%.2f", row.Ratio)
		if row.Ratio > 1.0 {
			rat = "**" + rat + "**"
		}
	}
	return
}

func n(s *Stats) int {
	if s == nil {
		return 0
	}
	return s.N
}

func table(rows []*Row, ref string) string {
	if ref == "" {
		ref = "sshd"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| # | workload | stat | n | sandgate | spread | %s | spread | sandgate/%s | notes |\n", ref, ref)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		sg, sgs, ref, refs, rat := row.cells()
		name := row.Name
		if row.SGName != "" || row.RefName != "" {
			kind := "sshd"
			if row.RefKind != "" {
				kind = row.RefKind
			}
			name += fmt.Sprintf(" <br><sub>sandgate: %s; %s: %s</sub>", dash(row.SGName), kind, dash(row.RefName))
		}
		cnt := fmt.Sprintf("%d/%d", n(row.SG), n(row.Ref))
		if row.Skipped != "" {
			cnt = ""
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			row.ID, name, row.Stat, cnt, sg, sgs, ref, refs, rat, row.Note)
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# sandgate vs OpenSSH sshd (%s run)\n\n", r.Mode)
	fmt.Fprintf(&b, "Started %s, took %s. Sandbox driver for rows 1–4, 6, 7, 10: `%s`.\n\n", r.Started.UTC().Format(time.RFC3339), r.Duration, r.Driver)
	m := r.Machine
	b.WriteString("## Machine\n\n")
	fmt.Fprintf(&b, "- CPU: %s, %d cores, %s RAM\n", m.CPU, m.Cores, m.MemTotal)
	fmt.Fprintf(&b, "- Kernel: %s; OS: %s\n", m.Kernel, m.OS)
	fmt.Fprintf(&b, "- OpenSSH: client `%s`, server `%s`\n", m.OpenSSHClient, m.OpenSSHServer)
	fmt.Fprintf(&b, "- Go: %s; Python: %s; Paramiko: %s\n", m.Go, dash(m.Python), dash(m.Paramiko))
	fmt.Fprintf(&b, "- sandgate: `%s`, commit `%s`\n", m.SandgateVersion, m.Commit)
	fmt.Fprintf(&b, "- Load average at start / end: %s / %s (2 shared cores: other test runs add noise)\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "- Scratch dir: %s (%s)\n\n", m.TmpDir, m.TmpFS)
	b.WriteString("## Setup\n\n")
	for _, s := range r.Setup {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	b.WriteString("\n## Results\n\n")
	b.WriteString("Times are wall-clock per run; sandgate and sshd runs alternate. " +
		"Ratio = sandgate/sshd of the shown statistic: **lower is better**, ≤ 1.00 means sandgate wins; bold marks a loss. " +
		"Spread: min–max under 10 samples, p10–p90 otherwise, p90–max for p99 rows.\n\n")
	var eq, stock []*Row
	for _, row := range r.Rows {
		if strings.HasPrefix(row.ID, "e") {
			eq = append(eq, row)
		} else {
			stock = append(stock, row)
		}
	}
	if len(eq) > 0 {
		b.WriteString("### Equal footing (the headline)\n\n" +
			"Same cipher and MAC on both sides (forced, and checked against what each negotiated), TCP_NODELAY on sshd's sockets, " +
			"one filesystem for both sides' files (see Setup); sandgate both through `sandgate ssh-config` (fd passing) and the copying `ProxyCommand sandgate proxy %h`; rows e4e-f and e5e-f put the copying proxy's hop in front of sshd too.\n\n")
		b.WriteString(table(eq, r.RefLabel))
	}
	if len(stock) > 0 {
		if len(eq) > 0 {
			b.WriteString("\n### Stock sshd (default settings; not the headline)\n\n" +
				"What a user with default settings sees: the client's default cipher on each side (chacha20-poly1305 with sshd, aes128-gcm with sandgate), " +
				"sshd with Nagle on its sockets until a session starts. Rows 4c/4d force one cipher.\n\n")
		}
		b.WriteString(table(stock, r.RefLabel))
	}
	if len(r.Extra) > 0 {
		b.WriteString("\n### Breakdown and extra rows\n\n")
		b.WriteString(table(r.Extra, r.RefLabel))
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, s := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", s)
		}
	}
	return b.String()
}

// Write stores the Markdown and JSON next to each other in dir.
func (r *Report) Write(dir, base string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	md := filepath.Join(dir, base+".md")
	js := filepath.Join(dir, base+".json")
	if err := os.WriteFile(md, []byte(r.Markdown()), 0o644); err != nil {
		return "", "", err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return "", "", err
	}
	tmp := js + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", "", err
	}
	return md, js, os.Rename(tmp, js)
}

// machineInfo gathers what the report says about the machine.
func machineInfo(sandgateBin, repo, python, tmp string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), TmpDir: tmp}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				var kb float64
				fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "MemTotal:")), "%f", &kb)
				m.MemTotal = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	m.Kernel = firstLine(cmdOut("uname", "-sr"))
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	m.OpenSSHClient = firstLine(cmdOut("ssh", "-V"))
	m.OpenSSHServer = firstLine(cmdOut(sshdPath, "-V"))
	if v := firstLine(cmdOut("go", "version")); v != "" {
		m.Go = v
	}
	m.SandgateVersion = firstLine(cmdOut(sandgateBin, "version"))
	m.Commit = firstLine(cmdOut("git", "-C", repo, "describe", "--always", "--dirty"))
	m.Python = firstLine(cmdOut(python, "--version"))
	m.Paramiko = firstLine(cmdOut(python, "-c", "import paramiko; print(paramiko.__version__)"))
	m.LoadStart = loadavg()
	m.TmpFS = firstLine(cmdOut("stat", "-f", "-c", "%T", tmp))
	return m
}

func cmdOut(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}
