package egress

import (
	"fmt"
	"time"
)

// The defaults of the connection bounds and timeouts (Config).
const (
	DefaultMaxConns          = 64
	DefaultMaxConnsPerTenant = 256
	DefaultIdleTimeout       = 10 * time.Minute
	DefaultHalfCloseTimeout  = 30 * time.Second

	// FDsPerConn is the most descriptors one proxy connection holds: the
	// sandbox's socket, the destination's, and a pipe (two descriptors)
	// each way while bytes move.
	FDsPerConn = 6

	// maxConnsCeiling caps the derived gateway-wide bound, whatever the
	// descriptor limit: each connection also costs goroutines and buffers.
	maxConnsCeiling = 4096
	// maxIdleUpstream bounds the idle keep-alive connections a session
	// keeps to destinations of plain http:// requests.
	maxIdleUpstream = 4
)

// MaxConnsFor is the default gateway-wide bound for a descriptor limit of
// nofile: egress may hold at most a quarter of the descriptors, so the
// main listener, SSH tunnels, file transfers and sandboxes keep the rest.
func MaxConnsFor(nofile uint64) int {
	n := nofile / 4 / FDsPerConn
	return int(max(16, min(n, maxConnsCeiling)))
}

// setLimits fills the bounds' defaults for a descriptor limit of nofile
// (0: unknown) and checks the ones set.
func (c *Config) setLimits(nofile uint64) error {
	if c.MaxConnsTotal <= 0 {
		if nofile == 0 {
			nofile = 1024
		}
		c.MaxConnsTotal = MaxConnsFor(nofile)
	} else if nofile > 0 && uint64(c.MaxConnsTotal)*FDsPerConn > nofile/2 {
		return fmt.Errorf("egress: at most %d connections in all need up to %d descriptors, more than half the descriptor limit (%d): lower --egress-max-conns or raise the limit (ulimit -n, LimitNOFILE=)",
			c.MaxConnsTotal, c.MaxConnsTotal*FDsPerConn, nofile)
	}
	if c.MaxConnsPerTenant <= 0 {
		c.MaxConnsPerTenant = DefaultMaxConnsPerTenant
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	c.MaxConnsPerTenant = min(c.MaxConnsPerTenant, c.MaxConnsTotal)
	c.MaxConns = min(c.MaxConns, c.MaxConnsPerTenant)
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.HalfCloseTimeout <= 0 {
		c.HalfCloseTimeout = DefaultHalfCloseTimeout
	}
	if c.RefusalsPerSecond <= 0 {
		c.RefusalsPerSecond = DefaultRefusalsPerTenant
	}
	if c.AskTimeout <= 0 {
		c.AskTimeout = DefaultAskTimeout
	}
	if c.MaxPendingTotal <= 0 {
		c.MaxPendingTotal = DefaultMaxPendingTotal
	}
	if c.MaxPendingPerTenant <= 0 {
		c.MaxPendingPerTenant = DefaultMaxPendingPerTenant
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	// A parked connection is a connection: more could never be parked.
	c.MaxPendingTotal = min(c.MaxPendingTotal, c.MaxConnsTotal)
	c.MaxPendingPerTenant = min(c.MaxPendingPerTenant, c.MaxPendingTotal, c.MaxConnsPerTenant)
	c.MaxPending = min(c.MaxPending, c.MaxPendingPerTenant, c.MaxConns)
	return nil
}

// Limits are the bounds a Proxy applies, defaults filled in.
type Limits struct {
	MaxConns, MaxConnsPerTenant, MaxConnsTotal int
	IdleTimeout, HalfCloseTimeout              time.Duration
	RefusalsPerSecond                          int
	AskTimeout                                 time.Duration
	MaxPending, MaxPendingPerTenant            int
	MaxPendingTotal                            int
}

// Limits reports the bounds in force, for the start-up log.
func (p *Proxy) Limits() Limits {
	return Limits{MaxConns: p.cfg.MaxConns, MaxConnsPerTenant: p.cfg.MaxConnsPerTenant, MaxConnsTotal: p.cfg.MaxConnsTotal,
		IdleTimeout: p.cfg.IdleTimeout, HalfCloseTimeout: p.cfg.HalfCloseTimeout, RefusalsPerSecond: p.cfg.RefusalsPerSecond,
		AskTimeout: p.cfg.AskTimeout, MaxPending: p.cfg.MaxPending, MaxPendingPerTenant: p.cfg.MaxPendingPerTenant,
		MaxPendingTotal: p.cfg.MaxPendingTotal}
}

// conns is how many connections tenant holds now.
func (p *Proxy) conns(tenant string) int {
	p.tmu.Lock()
	defer p.tmu.Unlock()
	return p.tenants[tenant]
}
