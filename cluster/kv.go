package cluster

import (
	"context"
	"errors"
	"time"
)

// KV is the cluster's shared store: what the cluster's code needs of etcd,
// and all it uses. Two implementations: etcd (EtcdKV) and the Kubernetes
// API (cluster/kubestore). Their conformance suite is cluster/kvtest.
//
// Every key has a create and a mod revision from one counter that every
// write of the store moves (0: the key is absent). A Txn evaluates its
// compares and applies Then (or Else) atomically: no other write of the
// store happens between them. A key put with a lease is gone (absent,
// revision 0) once its lease expired or was revoked.
type KV interface {
	// Get returns key (nil: absent).
	Get(ctx context.Context, key string) (*KeyValue, error)
	// List returns the keys under prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]KeyValue, error)
	// Count is how many keys are under prefix.
	Count(ctx context.Context, prefix string) (int64, error)
	// Put writes key (on lease, unless 0).
	Put(ctx context.Context, key, value string, lease int64) error
	// Txn applies then if every compare holds, otherwise els.
	Txn(ctx context.Context, cmps []Cmp, then, els []Op) (TxnResult, error)
	// Grant makes a lease that expires ttl after its last keepalive.
	Grant(ctx context.Context, ttl time.Duration) (int64, error)
	// KeepAlive renews lease; ErrLeaseNotFound once it expired.
	KeepAlive(ctx context.Context, lease int64) error
	// Revoke ends lease now: its keys are gone.
	Revoke(ctx context.Context, lease int64) error
	// WatchGone signals (best effort, coalesced) when a key under prefix
	// may have gone; it is closed when ctx ends or the watch breaks (make
	// it again). Callers also poll: a watch may miss.
	WatchGone(ctx context.Context, prefix string) <-chan struct{}
	// Close releases the client.
	Close() error
}

// ErrLeaseNotFound is KeepAlive's answer for a lease that expired.
var ErrLeaseNotFound = errors.New("cluster: lease not found (expired or revoked)")

// KeyValue is one key of a KV.
type KeyValue struct {
	Key, Value        string
	CreateRev, ModRev int64
	Lease             int64
}

// CmpTarget is what a compare looks at.
type CmpTarget int

const (
	// CmpValue compares the key's value (an absent key fails every compare).
	CmpValue CmpTarget = iota
	// CmpCreate compares the key's create revision (0: absent).
	CmpCreate
	// CmpMod compares the key's mod revision (0: absent).
	CmpMod
)

// Cmp is a compare of a Txn: Target Op (Value or Rev), Op one of = > <.
type Cmp struct {
	Key    string
	Target CmpTarget
	Op     string
	Value  string
	Rev    int64
}

// CompareValue is key's value op v.
func CompareValue(key, op, v string) Cmp { return Cmp{Key: key, Target: CmpValue, Op: op, Value: v} }

// CompareCreate is key's create revision op rev.
func CompareCreate(key, op string, rev int64) Cmp {
	return Cmp{Key: key, Target: CmpCreate, Op: op, Rev: rev}
}

// CompareMod is key's mod revision op rev.
func CompareMod(key, op string, rev int64) Cmp {
	return Cmp{Key: key, Target: CmpMod, Op: op, Rev: rev}
}

// Holds evaluates c against kv (nil: absent).
func (c Cmp) Holds(kv *KeyValue) bool {
	if c.Target == CmpValue {
		if kv == nil {
			return false
		}
		return cmpOrdered(kv.Value, c.Op, c.Value)
	}
	var rev int64
	if kv != nil {
		rev = kv.ModRev
		if c.Target == CmpCreate {
			rev = kv.CreateRev
		}
	}
	return cmpOrdered(rev, c.Op, c.Rev)
}

func cmpOrdered[T int64 | string](a T, op string, b T) bool {
	switch op {
	case "=":
		return a == b
	case ">":
		return a > b
	case "<":
		return a < b
	case "!=":
		return a != b
	}
	return false
}

// OpKind is what an Op does.
type OpKind int

const (
	// OpKindPut writes Key.
	OpKindPut OpKind = iota
	// OpKindDelete deletes Key.
	OpKindDelete
	// OpKindGet reads Key (TxnResult.Gets).
	OpKindGet
	// OpKindTxn applies Then if every If holds (a nested transaction:
	// its compares see the store as the outer compares did).
	OpKindTxn
)

// Op is an operation of a Txn.
type Op struct {
	Kind  OpKind
	Key   string
	Value string
	Lease int64
	If    []Cmp
	Then  []Op
}

// OpPut writes key (on lease, unless 0).
func OpPut(key, value string, lease int64) Op {
	return Op{Kind: OpKindPut, Key: key, Value: value, Lease: lease}
}

// OpDelete deletes key.
func OpDelete(key string) Op { return Op{Kind: OpKindDelete, Key: key} }

// OpGet reads key.
func OpGet(key string) Op { return Op{Kind: OpKindGet, Key: key} }

// OpTxn is a nested transaction (only puts and deletes in then).
func OpTxn(cmps []Cmp, then []Op) Op { return Op{Kind: OpKindTxn, If: cmps, Then: then} }

// TxnResult is a Txn's answer.
type TxnResult struct {
	Succeeded bool
	// Gets holds the answer of each OpGet of the branch applied, in
	// order (nil: the key is absent).
	Gets []*KeyValue
}
