//go:build linux

package initd

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/sandbox/linuxns/seccompprog"
)

// onFilteredThread runs f on a fresh thread that loaded prog (with
// no_new_privs, as the spawner thread does), and returns loadSeccomp's
// error; the thread ends with its goroutine, filter and all.
func onFilteredThread(prog []byte, f func()) error {
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			errc <- err
			return
		}
		err := loadSeccomp(prog)
		if err == nil && f != nil {
			f()
		}
		errc <- err
	}()
	return <-errc
}

// The init loads the program the gateway assembled, as it comes in the
// spec, and the kernel then refuses what it blocks, on that thread only;
// a spec without a program, or with a malformed one, fails the build
// rather than leaving the sandbox unfiltered.
func TestLoadSeccompProgram(t *testing.T) {
	prog, err := seccompprog.Program(false)
	if err != nil {
		t.Skipf("no seccomp filter on this architecture: %v", err)
	}
	var filtered, plain unix.Errno
	keyring := int32(unix.KEY_SPEC_SESSION_KEYRING)
	sessionKeyring := uintptr(uint32(keyring))
	keyctl := func() unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, sessionKeyring, 0)
		return e
	}
	if err := onFilteredThread(prog, func() { filtered = keyctl() }); err != nil {
		t.Fatal(err)
	}
	if filtered != unix.EPERM {
		t.Errorf("keyctl under the filter: %v, want EPERM", filtered)
	}
	if plain = keyctl(); plain == unix.EPERM {
		t.Errorf("keyctl on an unfiltered thread: EPERM; the filter leaked")
	}
	for name, bad := range map[string][]byte{"none": nil, "torn": prog[:len(prog)-3], "too long": make([]byte, 8*(maxFilterInstructions+1))} {
		if err := onFilteredThread(bad, nil); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// BenchmarkSeccompLoad is what the filter adds to a sandbox's start now
// that the gateway assembles it: loading it on a thread (each on a fresh
// thread, which ends with its goroutine).
func BenchmarkSeccompLoad(b *testing.B) {
	prog, err := seccompprog.Program(false)
	if err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if err := onFilteredThread(prog, nil); err != nil {
			b.Fatal(err)
		}
	}
}
