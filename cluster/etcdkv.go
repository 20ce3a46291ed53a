package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdConfig reaches etcd.
type EtcdConfig struct {
	Endpoints          []string
	TLS                *tls.Config
	Username, Password string
}

// EtcdKV is the KV of an etcd cluster.
type EtcdKV struct{ cli *clientv3.Client }

// OpenEtcd connects to etcd (lazily: the first operation dials).
func OpenEtcd(cfg EtcdConfig) (*EtcdKV, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, TLS: cfg.TLS, Username: cfg.Username, Password: cfg.Password,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client: %w", err)
	}
	return &EtcdKV{cli: cli}, nil
}

type etcdKeyValue = mvccpb.KeyValue

func fromEtcd(kvs []*etcdKeyValue) []KeyValue {
	out := make([]KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, KeyValue{Key: string(kv.Key), Value: string(kv.Value), CreateRev: kv.CreateRevision, ModRev: kv.ModRevision, Lease: kv.Lease})
	}
	return out
}

// Get implements KV.
func (e *EtcdKV) Get(ctx context.Context, key string) (*KeyValue, error) {
	resp, err := e.cli.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return &fromEtcd(resp.Kvs)[0], nil
}

// List implements KV.
func (e *EtcdKV) List(ctx context.Context, prefix string) ([]KeyValue, error) {
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	return fromEtcd(resp.Kvs), nil
}

// Count implements KV.
func (e *EtcdKV) Count(ctx context.Context, prefix string) (int64, error) {
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// Put implements KV.
func (e *EtcdKV) Put(ctx context.Context, key, value string, lease int64) error {
	_, err := e.cli.Put(ctx, key, value, clientv3.WithLease(clientv3.LeaseID(lease)))
	return err
}

func etcdCmps(cmps []Cmp) []clientv3.Cmp {
	out := make([]clientv3.Cmp, 0, len(cmps))
	for _, c := range cmps {
		switch c.Target {
		case CmpValue:
			out = append(out, clientv3.Compare(clientv3.Value(c.Key), c.Op, c.Value))
		case CmpCreate:
			out = append(out, clientv3.Compare(clientv3.CreateRevision(c.Key), c.Op, c.Rev))
		default:
			out = append(out, clientv3.Compare(clientv3.ModRevision(c.Key), c.Op, c.Rev))
		}
	}
	return out
}

func etcdOps(ops []Op) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(ops))
	for _, o := range ops {
		switch o.Kind {
		case OpKindPut:
			out = append(out, clientv3.OpPut(o.Key, o.Value, clientv3.WithLease(clientv3.LeaseID(o.Lease))))
		case OpKindDelete:
			out = append(out, clientv3.OpDelete(o.Key))
		case OpKindGet:
			out = append(out, clientv3.OpGet(o.Key))
		case OpKindTxn:
			out = append(out, clientv3.OpTxn(etcdCmps(o.If), etcdOps(o.Then), nil))
		}
	}
	return out
}

// Txn implements KV.
func (e *EtcdKV) Txn(ctx context.Context, cmps []Cmp, then, els []Op) (TxnResult, error) {
	tr, err := e.cli.Txn(ctx).If(etcdCmps(cmps)...).Then(etcdOps(then)...).Else(etcdOps(els)...).Commit()
	if err != nil {
		return TxnResult{}, err
	}
	res := TxnResult{Succeeded: tr.Succeeded}
	for _, rp := range tr.Responses {
		g := rp.GetResponseRange()
		if g == nil {
			continue
		}
		if len(g.Kvs) == 0 {
			res.Gets = append(res.Gets, nil)
			continue
		}
		res.Gets = append(res.Gets, &fromEtcd(g.Kvs)[0])
	}
	return res, nil
}

// Grant implements KV.
func (e *EtcdKV) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	l, err := e.cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return 0, err
	}
	return int64(l.ID), nil
}

// KeepAlive implements KV.
func (e *EtcdKV) KeepAlive(ctx context.Context, lease int64) error {
	_, err := e.cli.KeepAliveOnce(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: %w", ErrLeaseNotFound, err)
	}
	return err
}

// Revoke implements KV.
func (e *EtcdKV) Revoke(ctx context.Context, lease int64) error {
	_, err := e.cli.Revoke(ctx, clientv3.LeaseID(lease))
	return err
}

// WatchGone implements KV: a watch of deletes (a lease's expiry deletes its
// keys), on the leader only.
func (e *EtcdKV) WatchGone(ctx context.Context, prefix string) <-chan struct{} {
	w := e.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithFilterPut())
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for range w {
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out
}

// Close implements KV.
func (e *EtcdKV) Close() error { return e.cli.Close() }
