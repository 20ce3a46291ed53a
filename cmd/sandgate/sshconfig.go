package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sshConfigMain is `sandgate ssh-config`: it writes a known_hosts file that
// pins the gateway's host keys for every session name, and prints a
// ~/.ssh/config block that uses it with StrictHostKeyChecking yes.
func sshConfigMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ssh-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	home, _ := os.UserHomeDir()
	knownHosts := fs.String("known-hosts", filepath.Join(home, ".ssh", "sandgate_known_hosts"), "known_hosts file to write")
	hostPattern := fs.String("host", "sbx-*", "Host pattern the block applies to (session ids start with sbx-)")
	if _, err := parseInterspersed(fs, args); err != nil {
		return 2
	}
	keys, err := fetchHostKeys(cf)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	var kh strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&kh, "%s %s\n", *hostPattern, k)
	}
	if err := os.MkdirAll(filepath.Dir(*knownHosts), 0o700); err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	if err := os.WriteFile(*knownHosts, []byte(kh.String()), 0o644); err != nil {
		fmt.Fprintln(stderr, "sandgate ssh-config:", err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		exe = "sandgate"
	}
	// Over plain http the proxy hands ssh the socket and exits; over https
	// it must stay and carry the TLS session.
	fdpass := ""
	if u, err := url.Parse(cf.apiURL); err == nil && u.Scheme == "http" {
		fdpass = " --fdpass"
	}
	fmt.Fprintf(stdout, `# sandgate sessions: ssh %s-id, sftp, scp; the token comes from SANDBOX_API_TOKEN.
Host %s
    User sandbox
    ProxyCommand %s proxy --api-url %s%s%s %%h
%s    UserKnownHostsFile %s
    StrictHostKeyChecking yes
    ForwardAgent no
    ForwardX11 no
    ServerAliveInterval 30
`, strings.TrimSuffix(*hostPattern, "*"), *hostPattern, quoteSSH(exe), quoteSSH(cf.apiURL), caArg(cf), fdpass, useFdpass(fdpass), quoteSSH(*knownHosts))
	return 0
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
