package gateway

import "net"

// CountTunnel returns conn, a CONNECT tunnel of the session, with the
// bytes read from it (from the client) and written to it (to the client)
// added to the session's TunnelBytes.
func (s *Session) CountTunnel(conn net.Conn) net.Conn {
	return &tunnelConn{Conn: conn, s: s}
}

// TunnelBytes are the bytes through the session's CONNECT tunnels since
// this gateway process started: in from clients, out to them.
func (s *Session) TunnelBytes() (in, out int64) {
	return s.tunnelIn.Load(), s.tunnelOut.Load()
}

type tunnelConn struct {
	net.Conn
	s *Session
}

// NetConn returns the connection under c, as (*tls.Conn).NetConn does, so
// that a reader can reach its socket (the SSH server's read-ahead probe
// and cork); reads and writes must still go through c to be counted.
func (c *tunnelConn) NetConn() net.Conn { return c.Conn }

func (c *tunnelConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.s.tunnelIn.Add(int64(n))
	return n, err
}

func (c *tunnelConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.s.tunnelOut.Add(int64(n))
	return n, err
}

// CloseWrite half-closes the underlying connection when it can.
func (c *tunnelConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
