package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pkg/sftp"
	"golang.org/x/sys/unix"
)

// sftpCPUMain is `sgbench sftpcpu --bin A --bin B ...`: it measures the CPU
// time `sandgate sftp-server` itself spends per transfer, without SSH, the
// gateway or the machine's other load in the way: the server runs on plain
// pipes, a pkg/sftp client drives it like OpenSSH's sftp does (32 KiB
// requests, 64 in flight), and the server's rusage is read when it exits.
// Binaries alternate run by run. A binary named sftp-server is taken to be
// OpenSSH's (/usr/lib/openssh/sftp-server) and run with -d, for reference.
func sftpCPUMain(args []string) int {
	fs := flag.NewFlagSet("sftpcpu", flag.ContinueOnError)
	var bins listFlag
	fs.Var(&bins, "bin", "sandgate binary (repeat to compare)")
	size := fs.String("size", "256MiB", "file size")
	reps := fs.Int("reps", 5, "runs per binary and direction")
	pipeSize := fs.Int("pipe-size", 0, "F_SETPIPE_SZ for the server's stdin/stdout pipes (0: kernel default)")
	if err := fs.Parse(args); err != nil || len(bins) == 0 {
		fmt.Fprintln(os.Stderr, "usage: sgbench sftpcpu --bin PATH [--bin PATH] [--size 256MiB] [--reps 5] [--pipe-size N]")
		return 2
	}
	n, err := parseSize(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	parent, err := chooseTmp(&config{size: n, scratch: "tmpfs"})
	if err != nil {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "sgbench-sftpcpu-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src.bin")
	if err := writeRandom(src, n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	type key struct{ bin, dir string }
	res := map[key][]float64{}
	for r := 0; r < *reps; r++ {
		for i := range bins {
			bin := bins[(i+r)%len(bins)]
			for _, d := range []string{"upload", "download"} {
				cpu, err := sftpRun(bin, dir, src, d, n, *pipeSize)
				if err != nil {
					fmt.Fprintf(os.Stderr, "%s %s: %v\n", bin, d, err)
					return 1
				}
				res[key{bin, d}] = append(res[key{bin, d}], cpu)
			}
		}
	}
	fmt.Printf("sftp-server CPU seconds per %s (median of %d; min-max)\n", *size, *reps)
	for _, d := range []string{"upload", "download"} {
		for _, bin := range bins {
			s := NewStats(res[key{bin, d}])
			fmt.Printf("  %-8s %-40s %.3f  (%.3f-%.3f)\n", d, bin, s.Median, s.Min, s.Max)
		}
	}
	return 0
}

func writeRandom(p string, n int64) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{7})
	buf := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(buf)) {
		k := min(left, int64(len(buf)))
		_, _ = rng.Read(buf[:k])
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func growPipeFile(f *os.File, size int) {
	if size <= 0 {
		return
	}
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size) })
	}
}

// sftpRun starts one sftp-server, moves the file one way, and returns the
// server's user+system CPU seconds.
func sftpRun(bin, dir, src, direction string, n int64, pipeSize int) (float64, error) {
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return 0, err
	}
	if direction == "download" {
		if _, err := os.Stat(filepath.Join(root, "f.bin")); err != nil {
			if err := os.Link(src, filepath.Join(root, "f.bin")); err != nil {
				return 0, err
			}
		}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	growPipeFile(inR, pipeSize)
	growPipeFile(outR, pipeSize)
	cmd := exec.Command(bin, "sftp-server", "--root", root)
	if filepath.Base(bin) == "sftp-server" { // OpenSSH's, for reference
		cmd = exec.Command(bin, "-d", root)
	}
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	inR.Close()
	outW.Close()
	c, err := sftp.NewClientPipe(outR, inW, sftp.MaxPacket(32768), sftp.MaxConcurrentRequestsPerFile(64), sftp.UseConcurrentReads(true), sftp.UseConcurrentWrites(true))
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, fmt.Errorf("sftp client: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	switch direction {
	case "upload":
		err = func() error {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			w, err := c.Create("up.bin")
			if err != nil {
				return err
			}
			if _, err := w.ReadFrom(f); err != nil {
				w.Close()
				return err
			}
			return w.Close()
		}()
	default:
		err = func() error {
			r, err := c.Open("f.bin")
			if err != nil {
				return err
			}
			defer r.Close()
			m, err := r.WriteTo(io.Discard)
			if err == nil && m != n {
				err = fmt.Errorf("read %d bytes, want %d", m, n)
			}
			return err
		}()
	}
	c.Close()
	inW.Close()
	outR.Close()
	werr := cmd.Wait()
	if err != nil {
		return 0, err
	}
	if werr != nil && cmd.ProcessState == nil {
		return 0, werr
	}
	return (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(), nil
}
