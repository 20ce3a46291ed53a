//go:build linux

package sftpd

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// stagingSize is the capacity asked for the splicer's own pipe: a READ of
// maxData bytes at any offset spans at most 65 pages.
const stagingSize = 512 << 10

// splicer answers READs without copying the file's bytes: splice(2) moves
// the page-cache pages of the file into a pipe of its own, which tells how
// many bytes there are before the reply's header is written, and then
// from that pipe into the output pipe behind the header. The reader of the
// output (the gateway) then copies each byte once; read(2) and write(2)
// cost two copies more, half of the server's CPU on a download.
//
// The output holds references to the file's pages, not copies, until the
// gateway reads them: a change to the file in between would show in a
// reply already sent. settle waits for the gateway to have read them
// before a request that changes file data is served, so replies read as
// they would in request order; a change made meanwhile by another process
// of the sandbox can show, as if the READ had come that much later.
//
// The file's pages only ever pass through the staging pipe, which is never
// written with write(2): a kernel with the old PIPE_BUF_FLAG_CAN_MERGE bug
// (CVE-2022-0847) could otherwise let a later write to the output land in
// the file's page cache.
type splicer struct {
	out  *os.File // the output: a pipe in blocking mode
	r, w int      // the staging pipe
	max  int      // longest READ staged whole

	// total counts the bytes put into the output; spliced is true while
	// the bytes up to mark may hold file pages the gateway has not read.
	total   int64
	mark    int64
	spliced bool
	sent    atomic.Int64 // bytes spliced into the output, for tests
}

// newSplicer returns a splicer for out, or nil when out is not a pipe in
// blocking mode or no staging pipe can be made; READs are then read(2).
func newSplicer(out *os.File) *splicer {
	if out == nil {
		return nil
	}
	rc, err := out.SyscallConn()
	if err != nil {
		return nil
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		ok = err == nil && fl&unix.O_NONBLOCK == 0
	})
	if !ok {
		return nil
	}
	var p [2]int
	if unix.Pipe2(p[:], unix.O_CLOEXEC) != nil {
		return nil
	}
	// Failing to grow leaves the default; max below follows what it is.
	_, _ = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, stagingSize)
	size, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
	page := os.Getpagesize()
	if err != nil || size < 4*page {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil
	}
	return &splicer{out: out, r: p[0], w: p[1], max: size - 2*page}
}

// fill stages up to n bytes of f from off and returns how many it staged.
// Nothing staged with an error says why; bytes staged before an error are
// kept, as a short read. A file its filesystem cannot splice from is
// errNoSplice.
func (sp *splicer) fill(f *os.File, off int64, n int) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	got := 0
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		for got < n {
			// NONBLOCK concerns the pipe only: a full one ends the fill
			// (it was empty at the start, so the first call moves bytes).
			k, err := unix.Splice(int(fd), &off, sp.w, nil, n-got, unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN && got > 0:
				return
			case err != nil:
				serr = err
				return
			case k == 0:
				return
			}
			got += int(k)
		}
	})
	if cerr != nil {
		return got, cerr
	}
	if got == 0 && serr != nil {
		switch {
		case errors.Is(serr, unix.EINVAL) && off > 1<<63-1-int64(n):
			// The kernel's range check, not the file: read(2) answers.
			return 0, errNoSpliceHere
		case errors.Is(serr, unix.EINVAL), errors.Is(serr, unix.ENOSYS), errors.Is(serr, unix.EOPNOTSUPP):
			return 0, errNoSplice
		case errors.Is(serr, unix.EAGAIN):
			// Nothing staged: a non-blocking file had nothing to give.
			return 0, errNoSpliceHere
		}
		return 0, &os.PathError{Op: "splice", Path: f.Name(), Err: serr}
	}
	// The staging pipe was empty, so it must hold exactly what was staged
	// (TIOCINQ is FIONREAD: the bytes in a pipe). Less means someone else
	// reads it (the same user, through /proc), and send would wait for
	// bytes that never come.
	if held, err := unix.IoctlGetInt(sp.r, unix.TIOCINQ); err != nil || held != got {
		return 0, fmt.Errorf("sftp: staging pipe holds %d bytes, %d staged: %w", held, got, errStagingShort)
	}
	return got, nil
}

// send moves n staged bytes into the output, waiting for room as write(2)
// does. An error leaves the output broken: the session ends.
func (sp *splicer) send(n int) error {
	rc, err := sp.out.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		for n > 0 {
			k, err := unix.Splice(sp.r, nil, int(fd), nil, n, 0)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				// Someone made the output non-blocking: wait as write does.
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
				if _, err := unix.Poll(pfd, -1); err != nil && err != unix.EINTR {
					serr = err
					return
				}
				continue
			case err != nil:
				serr = err
				return
			case k == 0:
				serr = errStagingShort
				return
			}
			n -= int(k)
			sp.sent.Add(k)
			sp.total += k
		}
	})
	sp.mark, sp.spliced = sp.total, true
	if cerr != nil {
		return fmt.Errorf("sftp: write reply: %w", cerr)
	}
	if serr != nil {
		return fmt.Errorf("sftp: write reply: %w", serr)
	}
	return nil
}

// wrote counts n bytes written into the output by write(2).
func (sp *splicer) wrote(n int) { sp.total += int64(n) }

// settle returns once the gateway has read every spliced byte out of the
// output (the bytes still in it are no more than those put in after the
// last splice), or the output's reader is gone (EPIPE). It waits as long
// as a write(2) into a full output would.
func (sp *splicer) settle() error {
	if !sp.spliced {
		return nil
	}
	rc, err := sp.out.SyscallConn()
	if err != nil {
		return err
	}
	for wait := 20 * time.Microsecond; ; wait = min(2*wait, time.Millisecond) {
		var unread int
		var gone bool
		var ierr error
		if cerr := rc.Control(func(fd uintptr) {
			unread, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ)
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			if n, _ := unix.Poll(pfd, 0); n > 0 && pfd[0].Revents&unix.POLLERR != 0 {
				gone = true
			}
		}); cerr != nil {
			return fmt.Errorf("sftp: wait for the output: %w", cerr)
		}
		switch {
		case ierr != nil:
			return fmt.Errorf("sftp: wait for the output: %w", ierr)
		case gone:
			return fmt.Errorf("sftp: wait for the output: %w", unix.EPIPE)
		case int64(unread) <= sp.total-sp.mark:
			sp.spliced = false
			return nil
		}
		time.Sleep(wait)
	}
}

func (sp *splicer) close() {
	unix.Close(sp.r)
	unix.Close(sp.w)
}
