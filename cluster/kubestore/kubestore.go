// Package kubestore is the cluster's shared store (cluster.KV) on the
// Kubernetes API: `serve --cluster-kube`. It keeps etcd's guarantees, so
// that the cluster's code is the same on both stores:
//
//   - Each key is a Secret (type sandgate.dev/kv) of the store's namespace, named
//     sgkv-<hash of the key>, holding the key, its value, its create and
//     mod revisions and its lease. A Secret carries a label per
//     directory of its key (sandgate.dev/kv-d<depth>: hash of the
//     directory), so a list by prefix is one labelled list.
//   - Node liveness is coordination.k8s.io Leases (sgkv-lease-<id>): a
//     key put on a lease is absent once its Lease's renewTime plus its
//     duration is past, or the Lease is gone.
//   - Transactions are serialized through one object, the Secret
//     sgkv-commit, that holds the store's revision and the last
//     transaction's writes. A transaction reads the keys it compares,
//     then commits by writing sgkv-commit with resourceVersion
//     compare-and-swap (a concurrent commit makes it start again), and
//     only then applies its writes to the keys. A write is applied only
//     over an older mod revision, and a delete leaves a tombstone (removed
//     a while later), so a late or repeated apply changes nothing; a
//     transaction that finds the previous one's writes not all applied
//     (its writer died) applies them first, and every read overlays them.
//     So compares and writes are atomic, as in an etcd transaction: a
//     tenant's quota is exact, and a session's owner is written once.
//
// Secrets rather than a CRD or ConfigMaps (values hold credentials, and
// Kubernetes' view role reads ConfigMaps): nothing to install before a node starts
// (the chart's CRDs are the Session and claim resources), and RBAC confined
// to the one namespace. The cost is one write of sgkv-commit per
// transaction for the whole cluster: creates are serialized through it.
package kubestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/sandgate/sandgate/cluster"
)

const (
	commitName  = "sgkv-commit"
	labelStore  = "sandgate.dev/kv"
	labelLease  = "sandgate.dev/kv-lease"
	leasePrefix = "sgkv-lease-"
	// tombstoneAge is how long a deleted key's tombstone stays: longer
	// than any apply of a transaction that committed before the delete.
	tombstoneAge = 2 * time.Minute
	// maxTxnBytes bounds a transaction's writes (and so a value): they
	// are held whole in sgkv-commit, a Secret, whose data the API server
	// caps at 1 MiB. Refused here with a clear error, not by the server
	// half way.
	maxTxnBytes = 900 << 10
)

// Store is a cluster.KV on the Kubernetes API.
type Store struct {
	c  *http.Client
	ns string
	// base is the API server's URL.
	base string

	// applied is the newest revision whose writes this store applied
	// all of: a transaction after it need not apply them again.
	applied atomic.Int64

	// clock is this host's clock (a test sets it); offset is the API
	// server's clock minus it, from the Date of the server's last answer.
	// A Lease's renewTime is stamped, and its expiry and a tombstone's age
	// judged, on the server's clock: every node then agrees on when a
	// lease ended, whatever the skew between their clocks.
	clock      func() time.Time
	offset     atomic.Int64
	haveOffset atomic.Bool
	// offLo and offHi bound the offset: every answer narrows them (its
	// Date is whole seconds, stamped between the request and the answer),
	// so the estimate, their middle, settles instead of jumping by up to
	// a second with each answer.
	offMu        sync.Mutex
	offLo, offHi time.Duration
	// dead holds the leases this store saw end: an ended lease stays
	// ended (as in etcd), even if a later estimate of the server's clock
	// is a little earlier.
	dead sync.Map

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Open returns the store over cfg in namespace ns.
func Open(cfg *rest.Config, ns string) (*Store, error) {
	if ns == "" {
		return nil, errors.New("kubestore: no namespace")
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubestore: %w", err)
	}
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	s := &Store{c: hc, ns: ns, base: strings.TrimSuffix(host, "/") + strings.TrimSuffix(cfg.APIPath, "/"), stop: make(chan struct{}), clock: time.Now}
	s.wg.Add(1)
	go s.collect()
	return s, nil
}

// InClusterNamespace is the pod's namespace (from its service account),
// or "" outside a pod.
func InClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ---- the API, as plain JSON over client-go's authenticated transport ----

type objectMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// configMap is a key's object: a Secret of type secretType (not a
// ConfigMap: session records hold credentials, such as the egress CA's
// key, and the built-in view role reads ConfigMaps, not Secrets). It is
// written with stringData and read back as data.
type configMap struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   objectMeta        `json:"metadata"`
	Type       string            `json:"type,omitempty"`
	StringData map[string]string `json:"stringData,omitempty"`
	Data       map[string][]byte `json:"data,omitempty"`
}

const secretType = "sandgate.dev/kv"

// newObject is the object name with labels and data d.
func newObject(name, rv string, labels, d map[string]string) configMap {
	return configMap{APIVersion: "v1", Kind: "Secret", Type: secretType,
		Metadata: objectMeta{Name: name, ResourceVersion: rv, Labels: labels}, StringData: d}
}

func (cm *configMap) get(k string) string { return string(cm.Data[k]) }

type configMapList struct {
	Items []configMap `json:"items"`
}

type leaseSpec struct {
	HolderIdentity       string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds int64  `json:"leaseDurationSeconds"`
	RenewTime            string `json:"renewTime,omitempty"`
}

type lease struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       leaseSpec  `json:"spec"`
}

type leaseList struct {
	Items []lease `json:"items"`
}

// apiError is a non-2xx answer.
type apiError struct {
	Code int
	Body string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("kubestore: the API server answered %d: %s", e.Code, strings.TrimSpace(e.Body))
}

func isCode(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

func (s *Store) cmPath(name string) string {
	p := "/api/v1/namespaces/" + url.PathEscape(s.ns) + "/secrets"
	if name != "" {
		p += "/" + name
	}
	return p
}

func (s *Store) leasePath(name string) string {
	p := "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(s.ns) + "/leases"
	if name != "" {
		p += "/" + name
	}
	return p
}

func (s *Store) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	sent := s.clock()
	resp, err := s.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		s.learnOffset(d, sent, s.clock())
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &apiError{Code: resp.StatusCode, Body: string(b)}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// ---- keys ----

var b32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

func objName(key string) string {
	h := sha256.Sum256([]byte(key))
	return "sgkv-" + b32.EncodeToString(h[:20])
}

func dirHash(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return hex.EncodeToString(h[:12])
}

// dirLabels labels a key with each of its directories.
func dirLabels(key string) map[string]string {
	l := map[string]string{labelStore: "1"}
	depth := 0
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			l["sandgate.dev/kv-d"+strconv.Itoa(depth)] = dirHash(key[:i+1])
			depth++
		}
	}
	return l
}

// prefixSelector is the label selector of every key under prefix (a
// superset when prefix does not end in /).
func prefixSelector(prefix string) string {
	dir := prefix[:strings.LastIndexByte(prefix, '/')+1]
	if dir == "" {
		return labelStore + "=1"
	}
	return labelStore + "=1,sandgate.dev/kv-d" + strconv.Itoa(strings.Count(dir, "/")-1) + "=" + dirHash(dir)
}

// record is a key's Secret, decoded.
type record struct {
	kv        cluster.KeyValue
	deleted   bool
	deletedAt int64
	rv        string
}

func decode(cm *configMap) record {
	d := cm.get
	r := record{rv: cm.Metadata.ResourceVersion, deleted: d("deleted") != ""}
	r.kv.Key, r.kv.Value = d("key"), d("value")
	r.kv.CreateRev, _ = strconv.ParseInt(d("create"), 10, 64)
	r.kv.ModRev, _ = strconv.ParseInt(d("mod"), 10, 64)
	r.kv.Lease, _ = strconv.ParseInt(d("lease"), 10, 64)
	r.deletedAt, _ = strconv.ParseInt(d("deleted"), 10, 64)
	return r
}

func encode(key string, r record, now time.Time) configMap {
	d := map[string]string{"key": key, "value": r.kv.Value, "create": strconv.FormatInt(r.kv.CreateRev, 10), "mod": strconv.FormatInt(r.kv.ModRev, 10)}
	if r.kv.Lease != 0 {
		d["lease"] = strconv.FormatInt(r.kv.Lease, 10)
	}
	if r.deleted {
		d["deleted"] = strconv.FormatInt(now.Unix(), 10)
		d["value"] = ""
	}
	return newObject(objName(key), r.rv, dirLabels(key), d)
}

// ---- the commit object ----

// write is one write of a committed transaction.
type write struct {
	Key    string `json:"k"`
	Value  string `json:"v,omitempty"`
	Lease  int64  `json:"l,omitempty"`
	Delete bool   `json:"d,omitempty"`
}

// commit is sgkv-commit: the store's revision and its transaction's writes.
type commit struct {
	rev    int64
	writes []write
	rv     string
}

func (s *Store) readCommit(ctx context.Context) (commit, error) {
	var cm configMap
	err := s.do(ctx, http.MethodGet, s.cmPath(commitName), nil, &cm)
	if isCode(err, http.StatusNotFound) {
		init := newObject(commitName, "", map[string]string{labelStore: "commit"}, map[string]string{"rev": "1"})
		err = s.do(ctx, http.MethodPost, s.cmPath(""), init, &cm)
		if isCode(err, http.StatusConflict) {
			err = s.do(ctx, http.MethodGet, s.cmPath(commitName), nil, &cm)
		}
	}
	if err != nil {
		return commit{}, err
	}
	c := commit{rv: cm.Metadata.ResourceVersion}
	c.rev, _ = strconv.ParseInt(cm.get("rev"), 10, 64)
	if w := cm.get("writes"); w != "" {
		if err := json.Unmarshal([]byte(w), &c.writes); err != nil {
			return commit{}, fmt.Errorf("kubestore: %s is malformed: %w", commitName, err)
		}
	}
	return c, nil
}

// ---- leases ----

// leases answers whether a lease is alive, each read once per operation.
type leases struct {
	s    *Store
	seen map[int64]bool
}

func (s *Store) leases() *leases { return &leases{s: s, seen: map[int64]bool{}} }

func leaseName(id int64) string { return leasePrefix + strconv.FormatUint(uint64(id), 16) }

func (l lease) alive(now time.Time) bool {
	t, err := time.Parse(time.RFC3339Nano, l.Spec.RenewTime)
	return err == nil && now.Before(t.Add(time.Duration(l.Spec.LeaseDurationSeconds)*time.Second))
}

func (ls *leases) alive(ctx context.Context, id int64) (bool, error) {
	if id == 0 {
		return true, nil
	}
	if a, ok := ls.seen[id]; ok {
		return a, nil
	}
	if _, dead := ls.s.dead.Load(id); dead {
		return false, nil
	}
	var l lease
	err := ls.s.do(ctx, http.MethodGet, ls.s.leasePath(leaseName(id)), nil, &l)
	a := err == nil && l.alive(ls.s.now())
	if err != nil && !isCode(err, http.StatusNotFound) {
		return false, err
	}
	if !a {
		ls.s.dead.Store(id, struct{}{})
	}
	ls.seen[id] = a
	return a, nil
}

// present is r as a key (nil: absent, deleted or on a dead lease).
func (ls *leases) present(ctx context.Context, r *record) (*cluster.KeyValue, error) {
	if r == nil || r.deleted {
		return nil, nil
	}
	if ok, err := ls.alive(ctx, r.kv.Lease); err != nil || !ok {
		return nil, err
	}
	kv := r.kv
	return &kv, nil
}

// ---- reads ----

func (s *Store) readRecord(ctx context.Context, key string) (*record, error) {
	var cm configMap
	err := s.do(ctx, http.MethodGet, s.cmPath(objName(key)), nil, &cm)
	if isCode(err, http.StatusNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := decode(&cm)
	if r.kv.Key != key {
		return nil, fmt.Errorf("kubestore: %s holds key %q, not %q", cm.Metadata.Name, r.kv.Key, key)
	}
	return &r, nil
}

// overlay is r with c's write of the same key, if it is newer.
func overlay(c commit, key string, r *record) *record {
	for _, w := range c.writes {
		if w.Key != key || (r != nil && r.kv.ModRev >= c.rev) {
			continue
		}
		n := applied(w, c.rev, r)
		return &n
	}
	return r
}

// applied is r (nil: absent) after write w of revision rev.
func applied(w write, rev int64, r *record) record {
	n := record{}
	if r != nil {
		n.rv = r.rv
	}
	n.kv = cluster.KeyValue{Key: w.Key, Value: w.Value, ModRev: rev, CreateRev: rev, Lease: w.Lease}
	if r != nil && !r.deleted {
		n.kv.CreateRev = r.kv.CreateRev
	}
	n.deleted = w.Delete
	if w.Delete {
		n.kv.Value, n.kv.Lease = "", 0
	}
	return n
}

// Get implements cluster.KV.
func (s *Store) Get(ctx context.Context, key string) (*cluster.KeyValue, error) {
	// The commit object, then the key: a transaction committed before
	// the commit object was read is either that commit (overlaid) or was
	// applied before a later one committed, so before the key is read.
	// (Read at once, a key read before a commit was applied and a commit
	// object read after the next one would miss a committed write.)
	c, err := s.readCommit(ctx)
	if err != nil {
		return nil, err
	}
	r, err := s.readRecord(ctx, key)
	if err != nil {
		return nil, err
	}
	return s.leases().present(ctx, overlay(c, key, r))
}

// List implements cluster.KV. Its keys are of one revision: the commit
// object is read before and after the list. Unchanged, the list holds
// every write up to it but its own (overlaid). One commit later, the list
// may hold part of that commit's writes (applied while listing), and
// overlaying all of them gives the state after it. Further: list again.
func (s *Store) List(ctx context.Context, prefix string) ([]cluster.KeyValue, error) {
	c, err := s.readCommit(ctx)
	if err != nil {
		return nil, err
	}
	for range 16 {
		var l configMapList
		if err := s.do(ctx, http.MethodGet, s.cmPath("")+"?labelSelector="+url.QueryEscape(prefixSelector(prefix)), nil, &l); err != nil {
			return nil, err
		}
		c2, err := s.readCommit(ctx)
		if err != nil {
			return nil, err
		}
		if c2.rev > c.rev+1 {
			c = c2
			continue
		}
		recs := map[string]*record{}
		for i := range l.Items {
			r := decode(&l.Items[i])
			if strings.HasPrefix(r.kv.Key, prefix) {
				recs[r.kv.Key] = &r
			}
		}
		for _, cc := range []commit{c, c2} {
			for _, w := range cc.writes {
				if strings.HasPrefix(w.Key, prefix) {
					recs[w.Key] = overlay(cc, w.Key, recs[w.Key])
				}
			}
		}
		ls := s.leases()
		out := make([]cluster.KeyValue, 0, len(recs))
		for _, r := range recs {
			kv, err := ls.present(ctx, r)
			if err != nil {
				return nil, err
			}
			if kv != nil {
				out = append(out, *kv)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
		return out, nil
	}
	return nil, fmt.Errorf("kubestore: too many commits while listing %q", prefix)
}

// Count implements cluster.KV.
func (s *Store) Count(ctx context.Context, prefix string) (int64, error) {
	kvs, err := s.List(ctx, prefix)
	return int64(len(kvs)), err
}

// ---- writes ----

// applyWrite writes w of revision rev to its key's Secret, unless the
// key is already at rev or newer.
func (s *Store) applyWrite(ctx context.Context, w write, rev int64) error {
	for range 16 {
		r, err := s.readRecord(ctx, w.Key)
		if err != nil {
			return err
		}
		if r != nil && r.kv.ModRev >= rev {
			return nil
		}
		if w.Delete && (r == nil || r.deleted) {
			return nil
		}
		if r != nil && !r.deleted {
			// A key on a dead lease is absent: a put makes it anew.
			if ok, err := s.leases().alive(ctx, r.kv.Lease); err != nil {
				return err
			} else if !ok {
				r.deleted = true
			}
		}
		if r == nil {
			// No object: creating one is right only while rev is the
			// store's last commit. Past it, the next committer applied
			// rev's writes before committing, so the object was made and
			// then deleted, its tombstone collected: made again, a late
			// apply (a writer stalled past tombstoneAge) would bring a
			// deleted key back.
			c, err := s.readCommit(ctx)
			if err != nil {
				return err
			}
			if c.rev > rev {
				return nil
			}
		}
		n := applied(w, rev, r)
		cm := encode(w.Key, n, s.now())
		if r == nil {
			err = s.do(ctx, http.MethodPost, s.cmPath(""), cm, nil)
		} else {
			err = s.do(ctx, http.MethodPut, s.cmPath(cm.Metadata.Name), cm, nil)
		}
		if isCode(err, http.StatusConflict) {
			continue // another apply of the same write, or a newer one
		}
		return err
	}
	return fmt.Errorf("kubestore: too much contention applying %q", w.Key)
}

func (s *Store) applyAll(ctx context.Context, writes []write, rev int64) error {
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() { errs[i] = s.applyWrite(ctx, w, rev) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Put implements cluster.KV.
func (s *Store) Put(ctx context.Context, key, value string, lease int64) error {
	_, err := s.Txn(ctx, nil, []cluster.Op{cluster.OpPut(key, value, lease)}, nil)
	return err
}

// Txn implements cluster.KV.
func (s *Store) Txn(ctx context.Context, cmps []cluster.Cmp, then, els []cluster.Op) (cluster.TxnResult, error) {
	for {
		c, err := s.readCommit(ctx)
		if err != nil {
			return cluster.TxnResult{}, err
		}
		// The previous transaction's writes first (its writer may have
		// died), unless this store applied them.
		if c.rev > s.applied.Load() {
			if err := s.applyAll(ctx, c.writes, c.rev); err != nil {
				return cluster.TxnResult{}, err
			}
			s.markApplied(c.rev)
		}
		ls := s.leases()
		recs, err := s.readAll(ctx, txnKeys(cmps, then, els))
		if err != nil {
			return cluster.TxnResult{}, err
		}
		seen := map[string]*cluster.KeyValue{}
		read := func(key string) (*cluster.KeyValue, error) {
			if kv, ok := seen[key]; ok {
				return kv, nil
			}
			r, ok := recs[key]
			if !ok {
				var err error
				if r, err = s.readRecord(ctx, key); err != nil {
					return nil, err
				}
			}
			kv, err := ls.present(ctx, r)
			if err != nil {
				return nil, err
			}
			seen[key] = kv
			return kv, nil
		}
		holds := func(cs []cluster.Cmp) (bool, error) {
			for _, cmp := range cs {
				kv, err := read(cmp.Key)
				if err != nil {
					return false, err
				}
				if !cmp.Holds(kv) {
					return false, nil
				}
			}
			return true, nil
		}
		ok, err := holds(cmps)
		if err != nil {
			return cluster.TxnResult{}, err
		}
		res := cluster.TxnResult{Succeeded: ok}
		ops := then
		if !ok {
			ops = els
		}
		var writes []write
		var collect func([]cluster.Op) error
		collect = func(ops []cluster.Op) error {
			for _, o := range ops {
				switch o.Kind {
				case cluster.OpKindPut:
					writes = append(writes, write{Key: o.Key, Value: o.Value, Lease: o.Lease})
				case cluster.OpKindDelete:
					writes = append(writes, write{Key: o.Key, Delete: true})
				case cluster.OpKindGet:
					kv, err := read(o.Key)
					if err != nil {
						return err
					}
					res.Gets = append(res.Gets, kv)
				case cluster.OpKindTxn:
					ok, err := holds(o.If)
					if err != nil {
						return err
					}
					if ok {
						if err := collect(o.Then); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}
		if err := collect(ops); err != nil {
			return cluster.TxnResult{}, err
		}
		if len(writes) == 0 {
			// Nothing to write: the reads were of one state if no commit
			// moved in between.
			if c2, err := s.readCommit(ctx); err != nil {
				return cluster.TxnResult{}, err
			} else if c2.rv != c.rv {
				continue
			}
			return res, nil
		}
		rev := c.rev + 1
		wj, _ := json.Marshal(writes)
		if len(wj) > maxTxnBytes {
			return cluster.TxnResult{}, fmt.Errorf("kubestore: a transaction writing %d bytes is over the store's %d (a Secret holds 1 MiB)", len(wj), maxTxnBytes)
		}
		next := newObject(commitName, c.rv, map[string]string{labelStore: "commit"},
			map[string]string{"rev": strconv.FormatInt(rev, 10), "writes": string(wj)})
		err = s.do(ctx, http.MethodPut, s.cmPath(commitName), next, nil)
		if isCode(err, http.StatusConflict) {
			continue // another transaction committed: evaluate again
		}
		if err != nil {
			return cluster.TxnResult{}, err
		}
		// Committed: the writes are the truth now (reads overlay them);
		// applying them is idempotent, and the next transaction finishes
		// what this one does not.
		if s.applyAll(ctx, writes, rev) == nil {
			s.markApplied(rev)
		}
		return res, nil
	}
}

func (s *Store) markApplied(rev int64) {
	for {
		cur := s.applied.Load()
		if rev <= cur || s.applied.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// txnKeys are the keys a transaction reads (its compares' and gets').
func txnKeys(cmps []cluster.Cmp, ops ...[]cluster.Op) []string {
	seen := map[string]bool{}
	var out []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for _, c := range cmps {
		add(c.Key)
	}
	for _, list := range ops {
		for _, o := range list {
			switch o.Kind {
			case cluster.OpKindGet:
				add(o.Key)
			case cluster.OpKindTxn:
				for _, k := range txnKeys(o.If, o.Then) {
					add(k)
				}
			}
		}
	}
	return out
}

// readAll reads keys' records at once.
func (s *Store) readAll(ctx context.Context, keys []string) (map[string]*record, error) {
	recs := make([]*record, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { recs[i], errs[i] = s.readRecord(ctx, k) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := make(map[string]*record, len(keys))
	for i, k := range keys {
		out[k] = recs[i]
	}
	return out, nil
}

// ---- leases ----

// Grant implements cluster.KV.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	var b [8]byte
	var id int64
	for id == 0 {
		_, _ = rand.Read(b[:])
		id = int64(binary.BigEndian.Uint64(b[:]) >> 1)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if !s.haveOffset.Load() {
		// Learn the server's clock before stamping the first Lease.
		if err := s.do(ctx, http.MethodGet, s.leasePath("")+"?limit=1", nil, nil); err != nil {
			return 0, err
		}
	}
	l := lease{APIVersion: "coordination.k8s.io/v1", Kind: "Lease",
		Metadata: objectMeta{Name: leaseName(id), Labels: map[string]string{labelLease: "1"}},
		Spec:     leaseSpec{HolderIdentity: "sandgate", LeaseDurationSeconds: secs, RenewTime: stamp(s.now())}}
	if err := s.do(ctx, http.MethodPost, s.leasePath(""), l, nil); err != nil {
		return 0, err
	}
	return id, nil
}

// learnOffset narrows the server's clock offset with an answer dated d,
// to a request sent at sent and answered at got (this host's clock).
func (s *Store) learnOffset(d, sent, got time.Time) {
	lo, hi := d.Sub(got), d.Add(time.Second).Sub(sent)
	s.offMu.Lock()
	defer s.offMu.Unlock()
	if s.haveOffset.Load() && lo <= s.offHi && hi >= s.offLo {
		lo, hi = max(lo, s.offLo), min(hi, s.offHi)
	} // else the first answer, or a clock stepped: start again
	s.offLo, s.offHi = lo, hi
	s.offset.Store(int64(lo + (hi-lo)/2))
	s.haveOffset.Store(true)
}

// now is the API server's time, as this store last learnt it.
func (s *Store) now() time.Time { return s.clock().Add(time.Duration(s.offset.Load())) }

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

// KeepAlive implements cluster.KV.
func (s *Store) KeepAlive(ctx context.Context, id int64) error {
	for range 8 {
		if _, dead := s.dead.Load(id); dead {
			_ = s.do(ctx, http.MethodDelete, s.leasePath(leaseName(id)), nil, nil)
			return cluster.ErrLeaseNotFound
		}
		var l lease
		err := s.do(ctx, http.MethodGet, s.leasePath(leaseName(id)), nil, &l)
		if isCode(err, http.StatusNotFound) {
			return cluster.ErrLeaseNotFound
		}
		if err != nil {
			return err
		}
		if !l.alive(s.now()) {
			_ = s.do(ctx, http.MethodDelete, s.leasePath(leaseName(id)), nil, nil)
			return cluster.ErrLeaseNotFound
		}
		l.Spec.RenewTime = stamp(s.now())
		err = s.do(ctx, http.MethodPut, s.leasePath(leaseName(id)), l, nil)
		if isCode(err, http.StatusConflict) {
			continue
		}
		return err
	}
	return fmt.Errorf("kubestore: too much contention on lease %x", id)
}

// Revoke implements cluster.KV.
func (s *Store) Revoke(ctx context.Context, id int64) error {
	err := s.do(ctx, http.MethodDelete, s.leasePath(leaseName(id)), nil, nil)
	if isCode(err, http.StatusNotFound) {
		return nil
	}
	return err
}

// WatchGone implements cluster.KV: it polls the store's Leases every
// second and signals when one stops being alive (a key put on it is then
// gone).
func (s *Store) WatchGone(ctx context.Context, prefix string) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var was map[string]bool
		for {
			var l leaseList
			if err := s.do(ctx, http.MethodGet, s.leasePath("")+"?labelSelector="+url.QueryEscape(labelLease+"=1"), nil, &l); err != nil {
				if ctx.Err() != nil {
					return
				}
			} else {
				alive, now := map[string]bool{}, s.now()
				for _, it := range l.Items {
					if it.alive(now) {
						alive[it.Metadata.Name] = true
					}
				}
				for name := range was {
					if !alive[name] {
						select {
						case out <- struct{}{}:
						default:
						}
						break
					}
				}
				was = alive
			}
			select {
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// collect removes, every minute, tombstones older than tombstoneAge and
// Leases dead for as long.
func (s *Store) collect() {
	defer s.wg.Done()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s.collectOnce(ctx)
		cancel()
	}
}

func (s *Store) collectOnce(ctx context.Context) {
	var l configMapList
	if err := s.do(ctx, http.MethodGet, s.cmPath("")+"?labelSelector="+url.QueryEscape(labelStore+"=1"), nil, &l); err == nil {
		for i := range l.Items {
			r := decode(&l.Items[i])
			if r.deleted && s.now().Sub(time.Unix(r.deletedAt, 0)) > tombstoneAge {
				pre := map[string]any{"preconditions": map[string]string{"resourceVersion": r.rv}}
				_ = s.do(ctx, http.MethodDelete, s.cmPath(l.Items[i].Metadata.Name), pre, nil)
			}
		}
	}
	var ll leaseList
	if err := s.do(ctx, http.MethodGet, s.leasePath("")+"?labelSelector="+url.QueryEscape(labelLease+"=1"), nil, &ll); err == nil {
		for _, it := range ll.Items {
			if !it.alive(s.now().Add(-tombstoneAge)) {
				pre := map[string]any{"preconditions": map[string]string{"resourceVersion": it.Metadata.ResourceVersion}}
				_ = s.do(ctx, http.MethodDelete, s.leasePath(it.Metadata.Name), pre, nil)
			}
		}
	}
}

// Close implements cluster.KV.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.c.CloseIdleConnections()
	return nil
}
