package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/tunnel"
)

// The block ssh-config writes into ~/.ssh/config sits between these
// lines; a second run replaces it and --remove deletes it.
const (
	sshConfigBegin = "# >>> sandgate ssh-config >>> (managed by `sandgate ssh-config`; `sandgate ssh-config --remove` deletes it)"
	sshConfigEnd   = "# <<< sandgate ssh-config <<<"
	// knownHostsHeader is the first line of the known_hosts file
	// ssh-config writes: a file without it is never replaced nor deleted.
	knownHostsHeader = "# sandgate ssh-config: the gateway's host keys (managed by `sandgate ssh-config`; rewritten by each run, deleted by --remove)"
)

// sshConfigMain is `sandgate ssh-config`: it writes a known_hosts file that
// pins the gateway's host keys for every session name, and a marked
// ~/.ssh/config block that uses it with StrictHostKeyChecking yes. A
// second run replaces the block; --dry-run prints it; --remove deletes it.
func sshConfigMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ssh-config", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	home, _ := os.UserHomeDir()
	sshDir := filepath.Join(home, ".ssh")
	defaultKnownHosts := filepath.Join(sshDir, "sandgate_known_hosts")
	knownHosts := fs.String("known-hosts", defaultKnownHosts, "known_hosts file to write (of its own: a file that ssh-config did not write is never replaced nor deleted)")
	configFile := fs.String("config", filepath.Join(sshDir, "config"), "the ssh_config file to write the block into")
	hostPattern := fs.String("host", "sbx-* *"+sshNameSuffix, "Host patterns the block applies to (session ids start with sbx-; a session name gets the suffix "+sshNameSuffix+")")
	binary := fs.String("binary", "", "the sandgate the ProxyCommand runs (default: sandgate on PATH, else this binary)")
	dryRun := fs.Bool("dry-run", false, "print the block on stdout and write nothing")
	remove := fs.Bool("remove", false, "delete the block (and the known_hosts file) and exit")
	transport := fs.String("transport", envOr("SANDBOX_TRANSPORT", tunnel.TransportConnect),
		"the ProxyCommand's transport: connect (HTTP CONNECT), websocket (for front ends that do not pass CONNECT), or auto (CONNECT, then a WebSocket) (env SANDBOX_TRANSPORT)")
	if _, code, done := parseCommandFlags(fs, args, `Usage: sandgate ssh-config [flags]

Writes a block into ~/.ssh/config (creating ~/.ssh, 0700, if needed) that
lets ssh, sftp and scp reach sessions as "ssh sbx-ID" or, by name, as
"ssh NAME.sandgate": sandgate proxy as ProxyCommand, and the gateway's
host keys pinned in a known_hosts file. A second run replaces the block;
--remove deletes it; --dry-run prints it. With --transport websocket (or
auto) the ProxyCommand reaches the gateway through front ends that do not
pass CONNECT.
`, stdout, stderr); done {
		return code
	}
	if *remove {
		found, err := rewriteSSHConfig(*configFile, "")
		if err != nil {
			fmt.Fprintln(stderr, "sandgate ssh-config:", err)
			return 1
		}
		switch ours, err := ownKnownHosts(*knownHosts, defaultKnownHosts); {
		case err != nil:
			fmt.Fprintln(stderr, "sandgate ssh-config:", err)
			return 1
		case ours:
			if err := os.Remove(*knownHosts); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				fmt.Fprintln(stderr, "sandgate ssh-config:", err)
				return 1
			}
		default:
			fmt.Fprintf(stderr, "sandgate ssh-config: left %s alone: sandgate ssh-config did not write it\n", *knownHosts)
		}
		if found {
			fmt.Fprintf(stderr, "sandgate ssh-config: removed the block from %s\n", *configFile)
		} else {
			fmt.Fprintf(stderr, "sandgate ssh-config: %s has no sandgate block\n", *configFile)
		}
		return 0
	}
	tr, err := tunnel.ParseTransport(*transport)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config: --transport:", err)
		return 2
	}
	exe, note := proxyBinary(*binary)
	// Over plain http the proxy hands ssh the socket and exits; over https
	// it must stay and carry the TLS session, and over a WebSocket it
	// must stay and carry the frames.
	fdpass := ""
	if u, err := url.Parse(cf.apiURL); err == nil && u.Scheme == "http" && tr == tunnel.TransportConnect {
		fdpass = " --fdpass"
	}
	// The transport always goes into the block: the proxy would
	// otherwise take SANDBOX_TRANSPORT from the environment ssh runs it
	// in, which could differ from what the block was written for (and,
	// with --fdpass, not be connect).
	trArg := " --transport " + tr
	block := fmt.Sprintf(`%s
# sandgate sessions: ssh sbx-ID or NAME%s, sftp, scp; the token comes from SANDBOX_API_TOKEN.
Host %s
    User sandbox
    ProxyCommand %s proxy --api-url %s%s%s%s %%h
%s    UserKnownHostsFile %s
    StrictHostKeyChecking yes
    ForwardAgent no
    ForwardX11 no
    ServerAliveInterval 30
%s
`, sshConfigBegin, sshNameSuffix, *hostPattern, quoteSSH(exe), quoteSSH(cf.apiURL), caArg(cf), trArg, fdpass, useFdpass(fdpass), quoteSSH(*knownHosts), sshConfigEnd)
	if *dryRun {
		fmt.Fprint(stdout, block)
		return 0
	}
	keys, err := fetchHostKeys(cf)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	kh, err := knownHostsFile(*hostPattern, keys)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	if ours, err := ownKnownHosts(*knownHosts, defaultKnownHosts); err != nil || !ours {
		if err == nil {
			err = fmt.Errorf("%s exists and sandgate ssh-config did not write it (no %q first line): choose another --known-hosts", *knownHosts, knownHostsHeader)
		}
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	for _, dir := range []string{filepath.Dir(*knownHosts), filepath.Dir(*configFile)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			fmt.Fprintln(stderr, "sandgate ssh-config:", err)
			return 1
		}
	}
	if err := os.WriteFile(*knownHosts, []byte(kh), 0o644); err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	replaced, err := rewriteSSHConfig(*configFile, block)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	verb := "added the sandgate block to"
	if replaced {
		verb = "replaced the sandgate block in"
	}
	fmt.Fprintf(stderr, "sandgate ssh-config: %s %s and pinned the gateway's host keys in %s\n", verb, *configFile, *knownHosts)
	if note != "" {
		fmt.Fprintln(stderr, "sandgate ssh-config:", note)
	}
	return 0
}

// knownHostsFile is the known_hosts file pinning keys (as the gateway
// sent them: "type base64 [comment]") for hostPattern: the header line,
// then one line a key, each parsed and written afresh (no comment, no
// option), so that a key cannot carry another line.
func knownHostsFile(hostPattern string, keys []string) (string, error) {
	var kh strings.Builder
	kh.WriteString(knownHostsHeader + "\n")
	hosts := strings.Join(strings.Fields(hostPattern), ",")
	for _, k := range keys {
		pub, _, opts, rest, err := gossh.ParseAuthorizedKey([]byte(k))
		if err != nil || len(opts) > 0 || len(rest) > 0 || strings.ContainsAny(k, "\r\n") {
			return "", fmt.Errorf("the gateway sent a host key that is not one public key: %.80q", k)
		}
		fmt.Fprintf(&kh, "%s %s", hosts, gossh.MarshalAuthorizedKey(pub))
	}
	return kh.String(), nil
}

// ownKnownHosts reports whether ssh-config may replace or delete the
// known_hosts file path: there is none, it starts with knownHostsHeader,
// or it is the default file (sandgate's own name, written before the
// header existed).
func ownKnownHosts(path, defaultPath string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, iofs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, len(knownHostsHeader)+1)
	n, _ := io.ReadFull(f, head)
	if string(head[:n]) == knownHostsHeader+"\n" {
		return true, nil
	}
	return filepath.Clean(path) == filepath.Clean(defaultPath), nil
}

// proxyBinary is the sandgate the ProxyCommand runs: --binary, else
// sandgate on PATH (a stable place such as /usr/local/bin), else this
// binary, with a note saying that a build tree's path may move.
func proxyBinary(flagged string) (string, string) {
	if flagged != "" {
		if abs, err := filepath.Abs(flagged); err == nil {
			return abs, ""
		}
		return flagged, ""
	}
	if p, err := exec.LookPath("sandgate"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs, ""
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return "sandgate", "sandgate is not on PATH; the block runs \"sandgate\" (make install, or --binary PATH)"
	}
	return exe, fmt.Sprintf("sandgate is not on PATH, so the block runs %s; run 'make install' (or pass --binary PATH) and run ssh-config again if that path may move", exe)
}

// rewriteSSHConfig replaces the marked block in the ssh_config file path
// with block ("" deletes it), or appends block when there is none. It
// reports whether a block was there. The file keeps its mode (new: 0600);
// a symbolic link is followed; the write is atomic.
func rewriteSSHConfig(path, block string) (bool, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	old, err := os.ReadFile(path)
	mode := os.FileMode(0o600)
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		if block == "" {
			return false, nil
		}
	case err != nil:
		return false, err
	default:
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	}
	text := string(old)
	found := false
	if i := strings.Index(text, sshConfigBegin); i >= 0 {
		j := strings.Index(text[i:], sshConfigEnd)
		if j < 0 {
			return false, fmt.Errorf("%s: the sandgate block's end line (%q) is missing; fix the file by hand", path, sshConfigEnd)
		}
		end := i + j + len(sshConfigEnd)
		if end < len(text) && text[end] == '\n' {
			end++
		}
		text = text[:i] + block + text[end:]
		found = true
	} else if block != "" {
		text = insertSSHBlock(text, block)
	}
	if text == string(old) {
		return found, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sandgate-ssh-config-")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return found, os.Rename(tmp.Name(), path)
}

// insertSSHBlock adds block to the ssh_config text before its first Host
// or Match line: ssh takes the first value of each option it reads, so a
// block after an earlier "Host *" would have that section's
// StrictHostKeyChecking or UserKnownHostsFile, not its own. Without such
// a line it goes at the end.
func insertSSHBlock(text, block string) string {
	off := 0
	for _, line := range strings.SplitAfter(text, "\n") {
		kw, _, _ := strings.Cut(strings.TrimLeft(line, " \t"), " ")
		kw, _, _ = strings.Cut(kw, "\t")
		kw, _, _ = strings.Cut(kw, "=")
		if k := strings.ToLower(strings.TrimSpace(kw)); k == "host" || k == "match" {
			return text[:off] + block + "\n" + text[off:]
		}
		off += len(line)
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	if text != "" {
		text += "\n"
	}
	return text + block
}

// quoteSSH quotes a value for ssh_config when it holds spaces.
func quoteSSH(s string) string {
	if strings.ContainsAny(s, " \t\"") {
		return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
	}
	return s
}

func fetchHostKeys(cf clientFlags) ([]string, error) {
	u, err := url.Parse(cf.apiURL)
	if err != nil {
		return nil, fmt.Errorf("invalid API URL: %w", err)
	}
	u.Path = strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1") + "/v1/host-keys"
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cf.token)
	tc, err := cf.tlsConfig()
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch host keys: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch host keys: %s (check SANDBOX_API_URL and SANDBOX_API_TOKEN)", resp.Status)
	}
	var body struct {
		HostKeys []string `json:"hostKeys"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("decode host keys: %w", err)
	}
	if len(body.HostKeys) == 0 {
		return nil, fmt.Errorf("the gateway returned no host keys")
	}
	return body.HostKeys, nil
}

// caArg passes the client's CA bundle on to the ProxyCommand.
func caArg(cf clientFlags) string {
	if cf.caFile == "" {
		return ""
	}
	abs, err := filepath.Abs(cf.caFile)
	if err != nil {
		abs = cf.caFile
	}
	return " --cacert " + quoteSSH(abs)
}

func useFdpass(flag string) string {
	if flag == "" {
		return ""
	}
	return "    ProxyUseFdpass yes\n"
}
