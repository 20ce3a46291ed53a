//go:build linux

package sftpd

import (
	"io"
	"os"
)

// PipeStdio is what Main serves, r and w as standard input and output, so
// that READs splice into w when it is a pipe in blocking mode. Close closes
// both, as the process's exit would.
func PipeStdio(r, w *os.File) io.ReadWriteCloser {
	return pipeStdio{stdio: stdio{Reader: r, WriteCloser: w}, in: r}
}

type pipeStdio struct {
	stdio
	in *os.File
}

func (p pipeStdio) Close() error {
	p.in.Close()
	return p.stdio.Close()
}
