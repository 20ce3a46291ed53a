package linuxns

import (
	"os/exec"
	"testing"
	"time"
)

// TestInitUnixSocketsWhileClosing lists the unix sockets of a process
// that opens and closes socket pairs all the time, as an init does its
// commands' connections: a descriptor closed between the listing and its
// copy is skipped, not an error (a fork of a busy session failed with
// "the init's descriptor N: bad file descriptor").
func TestInitUnixSocketsWhileClosing(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	cmd := exec.Command("python3", "-c", "import socket\nwhile True:\n    a, b = socket.socketpair(); a.close(); b.close()")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(200 * time.Millisecond)
	for i := range 2000 {
		socks, err := initUnixSockets(cmd.Process.Pid, true)
		if err != nil {
			t.Fatalf("listing %d: %v", i, err)
		}
		closeSocks(socks)
	}
}
