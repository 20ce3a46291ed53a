package sshd_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/sshd"
)

type authFailures struct {
	mu      sync.Mutex
	methods []string
}

func (a *authFailures) SSHAuthFailed(method string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.methods = append(a.methods, method)
}

func (a *authFailures) get() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.methods)
}

// Failed attempts are counted by method; the "none" probe a client sends
// first, and a successful login, are not.
func TestMetricsAuthFailures(t *testing.T) {
	fails := &authFailures{}
	h := newHarness(t, sshd.Config{AuthMethods: []string{sshd.AuthPassword}, Metrics: fails}, newFakeSandbox())
	_, err := h.dialWith(t, &gossh.ClientConfig{User: "sandbox", HostKeyCallback: gossh.InsecureIgnoreHostKey(),
		Auth: []gossh.AuthMethod{gossh.Password("wrong")}, Timeout: 10 * time.Second})
	if err == nil {
		t.Fatal("wrong password accepted")
	}
	if got := fails.get(); !slices.Equal(got, []string{sshd.AuthPassword}) {
		t.Errorf("failures %q, want [password]", got)
	}

	ok := &authFailures{}
	h = newHarness(t, sshd.Config{Metrics: ok}, newFakeSandbox())
	h.dial(t).Close()
	if got := ok.get(); len(got) != 0 {
		t.Errorf("a successful login counted failures %q", got)
	}
}
