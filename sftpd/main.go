package sftpd

import (
	"flag"
	"fmt"
	"io"
	"os"
)

// Main is `sandgate sftp-server`: it serves SFTP on stdin/stdout,
// confined to --root, which clients see as "/"; relative paths start at
// --start. Drivers start it inside the sandbox.
func Main(args []string) int {
	fs := flag.NewFlagSet("sftp-server", flag.ContinueOnError)
	root := fs.String("root", ".", "directory to serve")
	start := fs.String("start", "/", "start directory of the client, as it sees paths")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rw := stdio{Reader: os.Stdin, WriteCloser: os.Stdout}
	if err := ServeDir(*root, rw, WithStartDir(*start)); err != nil {
		fmt.Fprintln(os.Stderr, "sftp-server:", err)
		return 1
	}
	return 0
}

type stdio struct {
	io.Reader
	io.WriteCloser
}

// outFile lets Serve splice file data into standard output.
func (s stdio) outFile() *os.File {
	f, _ := s.WriteCloser.(*os.File)
	return f
}
