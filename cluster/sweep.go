package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// sweep marks failed the live sessions whose node is gone: its lease
// expired (it died, or lost etcd for longer than the TTL) and it left no
// restarting marker, or that marker's grace ran out. It sweeps as soon as
// a watch sees a node's record go, and every third of the lease TTL in
// any case (a watch misses what happens while etcd has no leader). Every
// node sweeps; each session is marked by exactly one, as the marking is a
// transaction on the record's revision.
func (n *Node) sweep() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.LeaseTTL / 3)
	defer t.Stop()
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var gone <-chan struct{}
	for {
		if gone == nil {
			gone = n.cli.WatchGone(wctx, Prefix+"nodes/")
		}
		select {
		case <-n.stop:
			return
		case <-t.C:
		case _, ok := <-gone:
			if !ok {
				gone = nil // made again at the next turn; the ticker sweeps meanwhile
				select {
				case <-n.stop:
					return
				case <-t.C:
				}
			}
		}
		ctx, cancelOnce := context.WithTimeout(context.Background(), n.cfg.LeaseTTL)
		if marked, err := n.SweepOnce(ctx); err != nil {
			n.log.Debug("cluster_sweep_failed", "err", err)
		} else if marked > 0 {
			n.log.Warn("cluster_sessions_failed", "sessions", marked, "reason", ReasonNodeLost)
		}
		cancelOnce()
	}
}

// SweepOnce marks the live sessions of lost nodes failed and says how many
// it marked.
func (n *Node) SweepOnce(ctx context.Context) (int, error) {
	// Signed records only: one refused (unsigned, forged or replayed)
	// neither keeps its node present nor, by existing, blocks the sweep
	// (markLost compares its revision, not its absence).
	present, refusedNode := map[string]bool{}, map[string]int64{}
	ns, err := n.cli.List(ctx, Prefix+"nodes/")
	if err != nil {
		return 0, err
	}
	for _, kv := range ns {
		node := strings.TrimPrefix(kv.Key, Prefix+"nodes/")
		if _, err := openInfo(n.cfg.Token, node, []byte(kv.Value), kv.Lease); err != nil {
			n.refused(node, err)
			refusedNode[node] = kv.ModRev
			continue
		}
		present[node] = true
	}
	rs, refusedMark, err := n.restartingNodes(ctx)
	if err != nil {
		return 0, err
	}
	for node := range rs {
		present[node] = true
	}
	lives, err := n.cli.List(ctx, Prefix+"live/")
	if err != nil {
		return 0, err
	}
	marked := 0
	for _, kv := range lives {
		node := kv.Value
		if present[node] {
			continue
		}
		// live/<tenant>/<id>
		rest := strings.TrimPrefix(kv.Key, Prefix+"live/")
		tk, id, ok := strings.Cut(rest, "/")
		if !ok {
			continue
		}
		if ok, err := n.markLost(ctx, tk, id, node, kv.ModRev, refusedNode[node], refusedMark[node]); err != nil {
			return marked, err
		} else if ok {
			marked++
			n.log.Warn("session_failed", "session", id, "node", node, "reason", ReasonNodeLost)
		}
	}
	return marked, nil
}

// markLost marks session id (of tenant key tk) failed because its node
// is lost, unless something changed it since the sweep read its live key
// at liveRev, or the node's record or restarting marker since the sweep
// found them absent or refused (nodeRev, markRev: the refused one's mod
// revision, 0 when absent).
func (n *Node) markLost(ctx context.Context, tk, id, node string, liveRev, nodeRev, markRev int64) (bool, error) {
	recKey := Prefix + "sessions/" + tk + "/" + id
	liveKey := Prefix + "live/" + tk + "/" + id
	rec, err := n.cli.Get(ctx, recKey)
	if err != nil {
		return false, err
	}
	if rec == nil {
		_, err := n.cli.Txn(ctx, []Cmp{CompareMod(liveKey, "=", liveRev)}, []Op{OpDelete(liveKey)}, nil)
		return false, err
	}
	var r gateway.Record
	if err := json.Unmarshal([]byte(rec.Value), &r); err != nil {
		return false, err
	}
	r.Status, r.StatusReason = gateway.StatusFailed, ReasonNodeLost
	data, _ := json.Marshal(r)
	tr, err := n.cli.Txn(ctx, []Cmp{
		CompareMod(recKey, "=", rec.ModRev),
		CompareMod(liveKey, "=", liveRev),
		CompareMod(Prefix+"nodes/"+node, "=", nodeRev),
		CompareMod(Prefix+"restarting/"+node, "=", markRev),
	}, append([]Op{OpPut(recKey, string(data), 0), OpDelete(liveKey)}, releaseOps(r, false)...), nil)
	if err != nil {
		return false, err
	}
	return tr.Succeeded, nil
}
