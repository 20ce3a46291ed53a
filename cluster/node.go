// Package cluster turns a gateway into one node of a cluster that shares
// its state through etcd: session records, ownership (which node holds a
// session's sandbox), tombstones and per-tenant live-session counts live in
// etcd; each node keeps its sandboxes, serves any request and relays those
// for sessions it does not hold to their owner (front.go).
//
// Layout of the keys, under Prefix:
//
//	nodes/<node>          the node's Info, on its lease: gone when it dies
//	restarting/<node>     a drained node's promise to come back, on a grace lease
//	owner/<id>            "<tenant>\x00<node>": who holds session id
//	sessions/<tenant>/<id> the session's gateway.Record (JSON)
//	live/<tenant>/<id>    present while the session is live: the quota counts these
//	guard/<tenant>        bumped by every create, so quota checks are exact
//	tombstones/<id>       the gateway.Tombstone of an ended session
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Prefix is where every key of the cluster lives in etcd.
const Prefix = "/sandgate/v1/"

// DefaultLeaseTTL is how long a node's lease outlives its last keepalive.
const DefaultLeaseTTL = 10 * time.Second

// DefaultRestartGrace is how long a drained node's sessions wait for it to
// come back before they are marked failed.
const DefaultRestartGrace = 5 * time.Minute

// ReasonNodeLost is the status reason of sessions whose node died.
const ReasonNodeLost = "node lost"

// Config makes a node.
type Config struct {
	// KV is the shared store; nil: etcd at Endpoints.
	KV KV
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// TLS, when set, is used towards etcd (its CA, and a client certificate).
	TLS *tls.Config
	// Username and Password authenticate to etcd when set.
	Username, Password string
	// NodeID names the node; empty means the one kept in DataDir (made once).
	NodeID string
	// DataDir keeps the node id across restarts.
	DataDir string
	// Advertise is the URL other nodes reach this node at (its --listen).
	Advertise string
	// LeaseTTL is the node's lease (default DefaultLeaseTTL).
	LeaseTTL time.Duration
	// RestartGrace bounds a drained node's absence (default DefaultRestartGrace).
	RestartGrace time.Duration
	// Token authenticates nodes to each other (relays).
	Token string
	// MaxSessionsPerTenant is the cluster-wide quota (exact).
	MaxSessionsPerTenant int
	// MaxSessions is this node's own cap, advertised for placement.
	MaxSessions int
	// OpTimeout bounds each etcd operation (default 3s).
	OpTimeout time.Duration
	Log       *slog.Logger
}

// Info is what a node advertises about itself, refreshed every third of
// its lease TTL.
type Info struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	Sessions    int       `json:"sessions"`
	MaxSessions int       `json:"maxSessions"`
	MemAvail    int64     `json:"memAvailableBytes"`
	Draining    bool      `json:"draining"`
	Updated     time.Time `json:"updated"`
	// Lease is the etcd lease the record was written on, signed with it:
	// a record replayed under another lease (or none) is refused.
	Lease int64 `json:"lease,omitempty"`
}

// Node is this gateway's membership of the cluster.
type Node struct {
	cfg Config
	cli KV
	log *slog.Logger

	lease    atomic.Int64 // the store lease, renewed by keepAlive
	healthy  atomic.Int64 // unix nanos of the last keepalive answer
	draining atomic.Bool
	sessions func() int // live sessions on this node

	mu          sync.Mutex
	owners      map[string]owner // owner cache: a session's owner never changes
	nodes       map[string]Info  // live nodes, as of the last refresh
	restarters  map[string]bool  // drained nodes within their grace
	store       *Store           // the node's store, once made
	refusedRecs map[string]bool  // node records refused and logged

	stop chan struct{}
	wg   sync.WaitGroup
}

type owner struct{ tenant, node string }

// Open connects to etcd, takes a lease and registers the node. sessions
// reports the node's live sessions (for placement).
func Open(ctx context.Context, cfg Config, sessions func() int) (*Node, error) {
	if cfg.KV == nil && len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < 2*time.Second {
		return nil, fmt.Errorf("cluster: lease TTL %s is below 2s", cfg.LeaseTTL)
	}
	if cfg.RestartGrace <= 0 {
		cfg.RestartGrace = DefaultRestartGrace
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 3 * time.Second
	}
	if len(cfg.Token) < 16 {
		return nil, errors.New("cluster: the cluster token must be at least 16 characters")
	}
	if cfg.Advertise == "" {
		return nil, errors.New("cluster: --cluster-advertise is required")
	}
	if cfg.NodeID == "" {
		id, err := nodeID(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		cfg.NodeID = id
	}
	if strings.ContainsAny(cfg.NodeID, "/\x00") {
		return nil, fmt.Errorf("cluster: node id %q may not hold / or NUL", cfg.NodeID)
	}
	cli := cfg.KV
	if cli == nil {
		e, err := OpenEtcd(EtcdConfig{Endpoints: cfg.Endpoints, TLS: cfg.TLS, Username: cfg.Username, Password: cfg.Password})
		if err != nil {
			return nil, err
		}
		cli = e
	}
	n := &Node{cfg: cfg, cli: cli, log: cfg.Log, sessions: sessions, owners: map[string]owner{}, stop: make(chan struct{})}
	if err := n.register(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	n.wg.Add(2)
	go n.keepAlive()
	go n.sweep()
	n.log.Info("cluster_joined", "node", cfg.NodeID, "advertise", cfg.Advertise, "lease_ttl", cfg.LeaseTTL)
	return n, nil
}

// nodeID returns the id kept in dataDir/cluster-node-id, made on first use.
func nodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "cluster-node-id")
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("cluster: read node id: %w", err)
	}
	raw := make([]byte, 6)
	_, _ = rand.Read(raw)
	id := "node-" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("cluster: store node id: %w", err)
	}
	return id, nil
}

func (n *Node) leaseID() int64 { return n.lease.Load() }

// ID is the node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

func (n *Node) op() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), n.cfg.OpTimeout)
}

// register takes a fresh lease and puts the node's record on it; a
// restarting marker of this node (a drain) is removed: the node is back.
func (n *Node) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := n.cli.Grant(ctx, n.cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("cluster: grant lease: %w", err)
	}
	n.lease.Store(l)
	data := n.signedInfo()
	if _, err := n.cli.Txn(ctx, nil, []Op{
		OpPut(Prefix+"nodes/"+n.cfg.NodeID, string(data), l),
		OpDelete(Prefix + "restarting/" + n.cfg.NodeID),
	}, nil); err != nil {
		return fmt.Errorf("cluster: register node: %w", err)
	}
	n.healthy.Store(time.Now().UnixNano())
	n.refresh()
	return nil
}

// refresh reads the live and restarting nodes into the node's view.
func (n *Node) refresh() {
	ctx, cancel := n.op()
	defer cancel()
	infos, err := n.Nodes(ctx)
	if err != nil {
		return
	}
	rs, _, err := n.restartingNodes(ctx)
	if err != nil {
		return
	}
	nodes := map[string]Info{}
	for _, i := range infos {
		nodes[i.ID] = i
	}
	n.mu.Lock()
	n.nodes, n.restarters = nodes, rs
	n.mu.Unlock()
}

// peer returns live node id as last seen.
func (n *Node) peer(id string) (Info, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, ok := n.nodes[id]
	return i, ok
}

// peers returns the live nodes as last seen.
func (n *Node) peers() []Info {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Info, 0, len(n.nodes))
	for _, i := range n.nodes {
		out = append(out, i)
	}
	return out
}

// liveNodes is how many nodes are live (at least 1: this one).
func (n *Node) liveNodes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return max(1, len(n.nodes))
}

// restarting reports whether node id was drained and may come back.
func (n *Node) restarting(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.restarters[id]
}

func (n *Node) info() Info {
	c := 0
	if n.sessions != nil {
		c = n.sessions()
	}
	return Info{ID: n.cfg.NodeID, URL: n.cfg.Advertise, Sessions: c, MaxSessions: n.cfg.MaxSessions,
		MemAvail: memAvailable(), Draining: n.draining.Load(), Updated: time.Now().UTC()}
}

// keepAlive renews the lease every third of its TTL and refreshes the
// node's record. A lease that expired (etcd was out of reach for longer
// than the TTL) is taken anew.
func (n *Node) keepAlive() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ctx, cancel := n.op()
		err := n.cli.KeepAlive(ctx, n.leaseID())
		if err == nil {
			err = n.cli.Put(ctx, Prefix+"nodes/"+n.cfg.NodeID, string(n.signedInfo()), n.leaseID())
		}
		cancel()
		switch {
		case err == nil:
			n.healthy.Store(time.Now().UnixNano())
			n.refresh()
			n.mu.Lock()
			st := n.store
			n.mu.Unlock()
			if st != nil {
				st.flush()
			}
		case errors.Is(err, ErrLeaseNotFound):
			n.log.Warn("cluster_lease_lost", "node", n.cfg.NodeID, "err", err)
			if rerr := n.register(context.Background()); rerr != nil {
				n.log.Error("cluster_register_failed", "err", rerr)
			}
		default:
			n.log.Warn("cluster_keepalive_failed", "node", n.cfg.NodeID, "err", err)
		}
	}
}

// Healthy reports whether the node heard from etcd within its lease TTL.
func (n *Node) Healthy() bool {
	return time.Since(time.Unix(0, n.healthy.Load())) < n.cfg.LeaseTTL
}

// Nodes returns the live nodes.
func (n *Node) Nodes(ctx context.Context) ([]Info, error) {
	kvs, err := n.cli.List(ctx, Prefix+"nodes/")
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(kvs))
	for _, kv := range kvs {
		key := strings.TrimPrefix(kv.Key, Prefix+"nodes/")
		i, err := openInfo(n.cfg.Token, key, []byte(kv.Value), kv.Lease)
		if err != nil {
			n.refused(key, err)
			continue
		}
		out = append(out, i)
	}
	return out, nil
}

// A node record in etcd is signed with the cluster token, so that only a
// node that has the token can join: whoever can write etcd but has not
// the token cannot register a node and so receive the relayed bearer
// tokens and the cluster token itself. Its value is
//
//	{"info": <Info as JSON>, "mac": hex(HMAC-SHA256(k, "<id>\x00" + info))}
//
// where k is HMAC-SHA256(token, "sandgate node record v1") and <id> the
// key's last element, which must be info's id.
type signedRecord struct {
	Info json.RawMessage `json:"info"`
	MAC  string          `json:"mac"`
}

func recordMAC(token, id string, info []byte) []byte {
	k := hmac.New(sha256.New, []byte(token))
	k.Write([]byte("sandgate node record v1"))
	m := hmac.New(sha256.New, k.Sum(nil))
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write(info)
	return m.Sum(nil)
}

// signedInfo is the node's record, signed, bound to its current lease.
func (n *Node) signedInfo() []byte {
	i := n.info()
	i.Lease = n.leaseID()
	info, _ := json.Marshal(i)
	data, _ := json.Marshal(signedRecord{Info: info, MAC: hex.EncodeToString(recordMAC(n.cfg.Token, n.cfg.NodeID, info))})
	return data
}

// restartMark is what a restarting/<node> marker holds, signed as a node
// record is (its MAC over "restarting\x00<node>"): the grace lease it
// was written on.
type restartMark struct {
	Node  string    `json:"node"`
	Lease int64     `json:"lease"`
	At    time.Time `json:"at"`
}

// signedMark is the node's restarting marker on grace lease lease.
func (n *Node) signedMark(lease int64) []byte {
	mark, _ := json.Marshal(restartMark{Node: n.cfg.NodeID, Lease: lease, At: time.Now().UTC()})
	data, _ := json.Marshal(signedRecord{Info: mark, MAC: hex.EncodeToString(recordMAC(n.cfg.Token, "restarting\x00"+n.cfg.NodeID, mark))})
	return data
}

// openMark checks the restarting marker of node (value, on lease).
func openMark(token, node string, value []byte, lease int64) error {
	var r signedRecord
	if err := json.Unmarshal(value, &r); err != nil || len(r.Info) == 0 || r.MAC == "" {
		return errUnsigned
	}
	mac, err := hex.DecodeString(r.MAC)
	if err != nil || !hmac.Equal(mac, recordMAC(token, "restarting\x00"+node, r.Info)) {
		return errBadMAC
	}
	var m restartMark
	if err := json.Unmarshal(r.Info, &m); err != nil || m.Node != node {
		return fmt.Errorf("malformed: %v", err)
	}
	if m.Lease == 0 || m.Lease != lease {
		return errReplayed
	}
	return nil
}

// restartingNodes reads the restarting markers: the nodes whose signed
// marker holds, and the mod revision of each marker refused (which a
// sweep must not take for a restarting node, nor let block it).
func (n *Node) restartingNodes(ctx context.Context) (valid map[string]bool, refused map[string]int64, err error) {
	kvs, err := n.cli.List(ctx, Prefix+"restarting/")
	if err != nil {
		return nil, nil, err
	}
	valid, refused = map[string]bool{}, map[string]int64{}
	for _, kv := range kvs {
		node := strings.TrimPrefix(kv.Key, Prefix+"restarting/")
		if err := openMark(n.cfg.Token, node, []byte(kv.Value), kv.Lease); err != nil {
			n.refused("restarting/"+node, err)
			refused[node] = kv.ModRev
			continue
		}
		valid[node] = true
	}
	return valid, refused, nil
}

// errUnsigned, errBadMAC and errReplayed are why a node record is refused.
var (
	errUnsigned = errors.New("not signed with the cluster token")
	errBadMAC   = errors.New("its signature does not match the cluster token")
	errReplayed = errors.New("signed for another etcd lease than the one it is on (a replayed record)")
)

// openInfo checks the record value of node key, on etcd lease lease, and
// returns its Info.
func openInfo(token, key string, value []byte, lease int64) (Info, error) {
	var r signedRecord
	if err := json.Unmarshal(value, &r); err != nil || len(r.Info) == 0 || r.MAC == "" {
		return Info{}, errUnsigned
	}
	mac, err := hex.DecodeString(r.MAC)
	if err != nil || !hmac.Equal(mac, recordMAC(token, key, r.Info)) {
		return Info{}, errBadMAC
	}
	var i Info
	if err := json.Unmarshal(r.Info, &i); err != nil || i.ID != key {
		return Info{}, fmt.Errorf("malformed: %v", err)
	}
	if i.Lease == 0 || i.Lease != lease {
		return Info{}, errReplayed
	}
	return i, nil
}

// refused logs a node record refused, once per key and reason while the
// node runs (bounded).
func (n *Node) refused(key string, err error) {
	n.mu.Lock()
	k := key + "\x00" + err.Error()
	seen := n.refusedRecs[k]
	if !seen && len(n.refusedRecs) < 1024 {
		if n.refusedRecs == nil {
			n.refusedRecs = map[string]bool{}
		}
		n.refusedRecs[k] = true
	}
	n.mu.Unlock()
	if !seen {
		n.log.Warn("cluster_node_record_refused", "node", key, "reason", err.Error(),
			"hint", "a node record in etcd that no node with this cluster token wrote: check who can write etcd, and that every node has the same --cluster-token-file")
	}
}

// Drain marks the node draining: placement sends it no new session.
func (n *Node) Drain() {
	n.draining.Store(true)
	ctx, cancel := n.op()
	defer cancel()
	if err := n.cli.Put(ctx, Prefix+"nodes/"+n.cfg.NodeID, string(n.signedInfo()), n.leaseID()); err != nil {
		n.log.Warn("cluster_drain_failed", "err", err)
	}
	n.log.Info("cluster_draining", "node", n.cfg.NodeID)
}

// Close leaves the cluster. With restarting, the node promises to come
// back (its sessions live on, kept by keep-sandboxes-on-exit) and other
// nodes leave its sessions alone for RestartGrace; without, it simply
// leaves.
func (n *Node) Close(restarting bool) {
	close(n.stop)
	n.wg.Wait()
	ctx, cancel := n.op()
	defer cancel()
	if restarting {
		if l, err := n.cli.Grant(ctx, n.cfg.RestartGrace); err == nil {
			err = n.cli.Put(ctx, Prefix+"restarting/"+n.cfg.NodeID, string(n.signedMark(l)), l)
			if err != nil {
				n.log.Warn("cluster_restart_mark_failed", "err", err)
			}
		}
	}
	if err := n.cli.Revoke(ctx, n.leaseID()); err != nil {
		n.log.Warn("cluster_revoke_failed", "err", err)
	}
	_ = n.cli.Close()
	n.log.Info("cluster_left", "node", n.cfg.NodeID, "restarting", restarting)
}

// memAvailable is MemAvailable of /proc/meminfo in bytes (0: unknown).
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
