package egress

import (
	"errors"
	"io"
	"net"
)

// copyRelay is relay by read and write, for connections splice(2) cannot
// serve (not sockets, or not Linux). Its buffer lives as long as the
// copy.
func copyRelay(dst, src net.Conn, moved func(int64)) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			moved(int64(n))
		}
		if errors.Is(err, io.EOF) {
			closeWrite(dst)
			return nil
		}
		if err != nil {
			return err
		}
	}
}
