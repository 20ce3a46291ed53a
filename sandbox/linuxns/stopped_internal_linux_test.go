//go:build linux

package linuxns

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

// coreImage is a CRIU core image: its CoreEntry has mtype, and, unless
// state is 0 (a thread's), a tc whose task_state is state, between other
// fields.
func coreImage(state uint64) []byte {
	var entry []byte
	entry = protowire.AppendTag(entry, 1, protowire.VarintType)
	entry = protowire.AppendVarint(entry, 1) // x86_64
	if state != 0 {
		var tc []byte
		tc = protowire.AppendTag(tc, 1, protowire.VarintType)
		tc = protowire.AppendVarint(tc, state)
		tc = protowire.AppendTag(tc, 6, protowire.BytesType)
		tc = protowire.AppendBytes(tc, []byte("sleep"))
		tc = protowire.AppendTag(tc, 21, protowire.VarintType)
		tc = protowire.AppendVarint(tc, 19) // stop_signo
		entry = protowire.AppendTag(entry, 3, protowire.BytesType)
		entry = protowire.AppendBytes(entry, tc)
	}
	entry = protowire.AppendTag(entry, 5, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte{0x08, 0x01})
	b := make([]byte, 8) // the two magic words
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

// stoppedAtDump finds, by the pid in their images' names, the tasks whose
// core image says stopped; not the running, dead or threads'; a core
// image it cannot read fails it.
func TestStoppedAtDump(t *testing.T) {
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"core-1.img":  coreImage(1),           // alive
		"core-7.img":  coreImage(taskStopped), // stopped
		"core-8.img":  coreImage(0),           // a thread of 7
		"core-9.img":  coreImage(2),           // dead
		"core-12.img": coreImage(taskStopped),
		"mm-7.img":    coreImage(taskStopped), // not a core image
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := stoppedAtDump(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[7] || !got[12] {
		t.Errorf("stopped: %v, want 7 and 12", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "core-13.img"), coreImage(1)[:10], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := stoppedAtDump(dir); err == nil {
		t.Error("a short core image: no error")
	}
}

func FuzzCoreTaskState(f *testing.F) {
	f.Add(coreImage(taskStopped))
	f.Add(coreImage(0))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = coreTaskState(b)
	})
}

// continueTree continues the init even where the images (tampered) say
// it was stopped at the dump: a stopped init would leave the gateway's
// dial of its control socket waiting until its timeout.
func TestContinueTreeContinuesInit(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState := func(want func(byte) bool) byte {
		var state byte
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var err error
			if state, _, err = procStat(pid); err == nil && want(state) {
				break
			}
		}
		return state
	}
	if state := waitState(func(s byte) bool { return s == 'T' }); state != 'T' {
		t.Fatalf("state %c after SIGSTOP", state)
	}
	ns := nsPids(pid)
	if len(ns) == 0 {
		t.Fatal("no NSpid")
	}
	if err := continueTree([]int{pid}, map[int]bool{ns[len(ns)-1]: true}); err != nil {
		t.Fatal(err)
	}
	if state := waitState(func(s byte) bool { return s != 'T' }); state == 'T' {
		t.Error("the init, said stopped at the dump, left stopped")
	}
}

// stoppedAtDump refuses a core image whose CoreEntry is larger than
// maxCoreEntry (a tampered image), rather than read it whole.
func TestStoppedAtDumpBoundsCoreEntry(t *testing.T) {
	var entry []byte
	entry = protowire.AppendTag(entry, 40, protowire.BytesType) // a field nobody reads
	entry = protowire.AppendBytes(entry, make([]byte, maxCoreEntry))
	b := make([]byte, 8)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "core-5.img"), append(b, entry...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := stoppedAtDump(dir); err == nil {
		t.Error("a core entry over the bound: no error")
	}
}
