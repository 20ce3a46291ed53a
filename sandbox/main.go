package sandbox

import (
	"flag"
	"fmt"
	"io"
	"os"
)

// SFTPServerMain is `sandgate sftp-server`: it serves SFTP on stdin/stdout,
// confined to --root. Drivers start it inside the sandbox.
func SFTPServerMain(args []string) int {
	fs := flag.NewFlagSet("sftp-server", flag.ContinueOnError)
	root := fs.String("root", ".", "directory to serve")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rw := stdio{Reader: os.Stdin, WriteCloser: os.Stdout}
	if err := ServeSFTP(*root, rw); err != nil {
		fmt.Fprintln(os.Stderr, "sftp-server:", err)
		return 1
	}
	return 0
}

type stdio struct {
	io.Reader
	io.WriteCloser
}
