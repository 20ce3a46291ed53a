// Package egress STUB: deleted before the real package merges.
package egress

import (
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

type List struct{ e []string }

func ParseList(entries []string) (List, error) { return List{entries}, nil }

type BadEntry struct{ Entry, Reason string }
type ListError struct{ Entries []BadEntry }

func (e *ListError) Error() string                  { return "bad" }
func (l List) Entries() []string                    { return l.e }
func (l List) Empty() bool                          { return len(l.e) == 0 }
func (l List) Allows(host string, port uint16) bool { return false }

type Bounds struct{}

func ParseBounds(patterns []string) (Bounds, error) { return Bounds{}, nil }
func (b Bounds) Outside(l List) []string            { return nil }

type Secret struct {
	Name        string
	Hosts       List
	Header      string
	Format      string
	Placeholder string
	Value       func() (string, bool)
}
type Policy struct {
	Allow   List
	Secrets []Secret
}
type Config struct {
	Log            *slog.Logger
	AllowCIDRs     []netip.Prefix
	Hosts          map[string][]netip.Addr
	Resolver       *net.Resolver
	UpstreamRoots  *x509.CertPool
	DialTimeout    time.Duration
	HeaderTimeout  time.Duration
	MaxHeaderBytes int
	MaxConns       int
}
type Proxy struct{}

func New(cfg Config) (*Proxy, error) { return &Proxy{}, nil }

type Session struct{}

func (p *Proxy) NewSession(id string, pol Policy, ca *CA) *Session { return &Session{} }
func (s *Session) SetPolicy(pol Policy)                            {}
func (s *Session) Policy() Policy                                  { return Policy{} }
func (s *Session) Bytes() (in, out int64)                          { return 0, 0 }
func (s *Session) AddBytes(in, out int64)                          {}
func (s *Session) Serve(ln net.Listener) error                     { return nil }
func (s *Session) Close() error                                    { return nil }

type CA struct{}

func NewCA(sessionID string) (*CA, error)                     { return &CA{}, nil }
func (c *CA) CertPEM() []byte                                 { return nil }
func (c *CA) MarshalPEM() (certPEM, keyPEM []byte, err error) { return nil, nil, nil }
func ParseCA(certPEM, keyPEM []byte) (*CA, error)             { return &CA{}, nil }
func Placeholder(name string) string                          { return "sandgate-placeholder-" + name }
