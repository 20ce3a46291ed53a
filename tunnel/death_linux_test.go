//go:build linux

package tunnel_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/tunnel"
)

// When a linux sandbox's init dies on its own, its session turns failed
// with a reason, and tunnels to it are refused with 409.
func TestLinuxSandboxDeathFailsSession(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root in CI")
		}
		t.Skip("needs root")
	}
	s := gwtest.Start(t, gwtest.Options{Driver: "linux"})
	id := s.CreateSession(t, nil).SessionID
	sess, err := s.Manager.Get(context.Background(), gateway.Principal{Tenant: "default"}, id)
	if err != nil {
		t.Fatal(err)
	}
	sb := sess.Sandbox()
	if u, ok := sb.(interface{ Unwrap() sandbox.Sandbox }); ok {
		sb = u.Unwrap()
	}
	ip, ok := sb.(interface{ InitPID() int })
	if !ok {
		t.Fatalf("sandbox %T is not a linux sandbox", sb)
	}
	if err := syscall.Kill(ip.InitPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var got struct {
		Status       string `json:"status"`
		StatusReason string `json:"statusReason"`
	}
	for {
		s.Do(t, s.Token, http.MethodGet, "/v1/sessions/"+id, nil, &got)
		if got.Status == gateway.StatusFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session still %q after its init died", got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got.StatusReason == "" {
		t.Fatal("failed session has no reason")
	}
	_, err = s.Dial(t, s.Token, id)
	var se *tunnel.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusConflict {
		t.Fatalf("dial a failed session: %v, want 409", err)
	}
}
