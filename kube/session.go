package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sandgate/sandgate/gateway"
)

// SessionSpec is a Session's spec: the REST create body's fields, with
// the same names and units, secrets naming Kubernetes Secrets.
type SessionSpec struct {
	Image        string                   `json:"image,omitempty"`
	TTL          int                      `json:"ttl,omitempty"` // seconds
	Egress       gateway.EgressEntries    `json:"egress,omitempty"`
	Resources    *gateway.ResourceRequest `json:"resources,omitempty"`
	Workspace    string                   `json:"workspace,omitempty"`
	FromSnapshot string                   `json:"fromSnapshot,omitempty"`
	Labels       map[string]string        `json:"labels,omitempty"`
	SSHPublicKey string                   `json:"sshPublicKey,omitempty"`
	Secrets      []SessionSecret          `json:"secrets,omitempty"`
}

// SessionSecret is one secret of a Session: its value is key of the
// Kubernetes Secret secretRef.name in the Session's namespace. Without
// hosts it is the environment variable name; with hosts the egress proxy
// sets it as a header on requests to them (REST's bound secret).
type SessionSecret struct {
	Name      string    `json:"name"`
	SecretRef SecretRef `json:"secretRef"`
	Hosts     []string  `json:"hosts,omitempty"`
	Header    string    `json:"header,omitempty"`
	Format    string    `json:"format,omitempty"`
}

// SecretRef names a key of a Kubernetes Secret.
type SecretRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// Phases of a Session.
const (
	PhasePending = "Pending"
	PhaseRunning = "Running"
	PhaseFailed  = "Failed"
	PhaseEnded   = "Ended"
)

// credentialsSecret is the name of the Secret holding obj's credentials.
func credentialsSecret(obj *unstructured.Unstructured, suffix string) string {
	n := obj.GetName() + suffix
	if len(n) > 253 {
		n = n[:253]
	}
	return n
}

func (c *Controller) reconcileSession(ctx context.Context, ns, name string) error {
	obj, err := c.get(ns, name, SessionGVR)
	if obj == nil || err != nil {
		return err
	}
	res := c.dyn.Resource(SessionGVR).Namespace(ns)
	id, _, _ := unstructured.NestedString(obj.Object, "status", "sessionId")
	secretName := credentialsSecret(obj, "-sandgate")
	if obj.GetDeletionTimestamp() != nil {
		return c.finish(ctx, res, obj, sessionFinalizer, id, secretName)
	}
	p := c.principalFor(ctx, obj, id)
	if !slices.Contains(obj.GetFinalizers(), sessionFinalizer) {
		obj.SetFinalizers(append(obj.GetFinalizers(), sessionFinalizer))
		if obj, err = res.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return ignoreGone(err)
		}
	}
	if id != "" {
		if err := c.reloadSessionSecrets(ctx, obj, p, id); err != nil {
			return err
		}
		return c.refresh(ctx, res, obj, p, id)
	}
	if phase, _, _ := unstructured.NestedString(obj.Object, "status", "phase"); phase == PhaseFailed {
		return nil // a spec the gateway refused: the user deletes or replaces it
	}
	var spec SessionSpec
	if err := convert(obj.Object["spec"], &spec); err != nil {
		return c.fail(ctx, res, obj, "InvalidSpec", err.Error())
	}
	cp := gateway.CreateParams{
		TTL: spec.TTL, Image: spec.Image, SSHPublicKey: spec.SSHPublicKey, Resources: spec.Resources, Egress: spec.Egress,
		Workspace: gateway.WorkspaceRef{Name: spec.Workspace, FromSnapshot: spec.FromSnapshot},
		// A retry after a failure past the create finds the session (a
		// replay) instead of making another one.
		IdempotencyKey: scopeOf(obj),
		// The Secrets' values are this session's alone.
		SecretScope: scopeOf(obj),
		Metadata:    map[string]any{"kubernetes": map[string]any{"namespace": ns, "name": name, "kind": "Session"}},
	}
	for k, v := range spec.Labels {
		cp.Metadata[k] = v
	}
	vals := map[string]string{}
	for _, s := range spec.Secrets {
		v, err := c.secretValue(ctx, ns, s.SecretRef)
		if err != nil {
			return c.secretProblem(ctx, res, obj, err)
		}
		vals[s.Name] = v
		cp.Secrets = append(cp.Secrets, gateway.SecretRef{Name: s.Name, Hosts: s.Hosts, Header: s.Header, Format: s.Format})
	}
	c.cfg.Secrets.Set(cp.SecretScope, vals)
	return c.createSession(ctx, res, obj, p, cp, secretName, nil)
}

// reloadSessionSecrets sets the values of the Secrets of obj, whose
// session id exists, again when the overlay has none for its scope (the
// gateway restarted: they were in memory only). Until then the session's
// processes do not start (secret_unavailable).
func (c *Controller) reloadSessionSecrets(ctx context.Context, obj *unstructured.Unstructured, p gateway.Principal, id string) error {
	scope := scopeOf(obj)
	if c.cfg.Secrets.Has(scope) {
		return nil
	}
	if _, err := c.cfg.Sessions.Get(ctx, p, id); err != nil {
		return nil // gone: refresh says so
	}
	var spec SessionSpec
	if err := convert(obj.Object["spec"], &spec); err != nil {
		return nil
	}
	vals := map[string]string{}
	for _, s := range spec.Secrets {
		v, err := c.secretValue(ctx, obj.GetNamespace(), s.SecretRef)
		if err != nil {
			return fmt.Errorf("session %s: reading its secret %s again: %w", id, s.Name, err) // retried
		}
		vals[s.Name] = v
	}
	c.cfg.Secrets.Set(scope, vals)
	return nil
}

// createSession makes cp's session for obj, the credentials Secret
// (with extra keys) and the status.
func (c *Controller) createSession(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, p gateway.Principal,
	cp gateway.CreateParams, secretName string, extra map[string]string,
) error {
	s, pw, err := c.cfg.Sessions.Create(ctx, p, cp)
	if err != nil {
		ge, ok := errors.AsType[*gateway.Error](err)
		if ok && permanent(ge) {
			c.cfg.Secrets.Drop(cp.SecretScope)
			return c.fail(ctx, res, obj, reasonOf(ge.Code), ge.Message)
		}
		if ok && ge.Kind == gateway.KindQuota { // waits for room, with backoff
			st := map[string]any{"phase": PhasePending, "observedGeneration": obj.GetGeneration()}
			if perr := c.putStatus(ctx, res, obj, st, condition(obj, "Ready", metav1.ConditionFalse, reasonOf(ge.Code), ge.Message)); perr != nil {
				return perr
			}
		}
		return err // retried
	}
	if pw != "" { // made now: its password is only here
		if err := c.writeCredentials(ctx, obj, secretName, s.ID, pw, extra); err != nil {
			_ = c.cfg.Sessions.Delete(context.WithoutCancel(ctx), p, s.ID)
			if errors.Is(err, errSecretTaken) {
				c.cfg.Secrets.Drop(cp.SecretScope)
				return c.fail(ctx, res, obj, "SecretConflict", err.Error())
			}
			return err
		}
	} else if sec, err := c.core.CoreV1().Secrets(obj.GetNamespace()).Get(ctx, secretName, metav1.GetOptions{}); err != nil || !ownedBy(sec, obj) {
		// A replay whose Secret is gone (or not ours): the password is
		// lost; end the session and make another on the next pass.
		if err == nil || apierrors.IsNotFound(err) {
			_ = c.cfg.Sessions.Delete(context.WithoutCancel(ctx), p, s.ID)
			return fmt.Errorf("session %s: credentials Secret %s missing", s.ID, secretName)
		}
		return err
	}
	return c.writeStatus(ctx, res, obj, s, secretName)
}

// writeCredentials creates (or replaces) the Secret, owned by obj.
func (c *Controller) writeCredentials(ctx context.Context, obj *unstructured.Unstructured, name, id, pw string, extra map[string]string) error {
	data := map[string]string{
		"sessionId":   id,
		"username":    c.cfg.SSHUsername,
		"password":    pw,
		"endpoint":    c.restURL(id),
		"connectPath": "/v1/sessions/" + id,
	}
	if c.cfg.HostKey != "" {
		data["knownHosts"] = "* " + c.cfg.HostKey
	}
	for k, v := range extra {
		data[k] = v
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: obj.GetNamespace(),
			Labels:          map[string]string{"app.kubernetes.io/managed-by": "sandgate", "sandgate.dev/session": id},
			OwnerReferences: []metav1.OwnerReference{ownerRef(obj)},
		},
		Type:       "sandgate.dev/session",
		StringData: data,
	}
	secrets := c.core.CoreV1().Secrets(obj.GetNamespace())
	_, err := secrets.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Replaced only when it is obj's own (a retry's): a Secret of
		// that name that someone else made (the user, or a Session and a
		// SandboxClaim of one name) is never overwritten.
		var old *corev1.Secret
		if old, err = secrets.Get(ctx, name, metav1.GetOptions{}); err == nil {
			if !ownedBy(old, obj) {
				return fmt.Errorf("%w: %s/%s is not this %s's", errSecretTaken, obj.GetNamespace(), name, obj.GetKind())
			}
			sec.ResourceVersion = old.ResourceVersion
			_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("credentials Secret %s/%s: %w", obj.GetNamespace(), name, err)
	}
	return nil
}

// errSecretTaken: the credentials Secret's name is another's Secret.
var errSecretTaken = errors.New("the credentials Secret's name is taken")

// ownedBy reports whether sec is obj's (an owner reference to its UID).
func ownedBy(sec *corev1.Secret, obj *unstructured.Unstructured) bool {
	return slices.ContainsFunc(sec.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == obj.GetUID() })
}

func ownerRef(obj *unstructured.Unstructured) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Name: obj.GetName(), UID: obj.GetUID(), Controller: &t, BlockOwnerDeletion: &t}
}

func (c *Controller) restURL(id string) string {
	return strings.TrimSuffix(c.cfg.PublicURL, "/") + "/v1/sessions/" + id
}

// writeStatus records s in obj's status.
func (c *Controller) writeStatus(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, s *gateway.Session, secretName string) error {
	snap := s.Snapshot()
	phase, ready, reason := PhaseRunning, metav1.ConditionTrue, "SessionRunning"
	switch snap.Status {
	case gateway.StatusRunning, gateway.StatusStopped:
	case gateway.StatusFailed:
		phase, ready, reason = PhaseFailed, metav1.ConditionFalse, "SessionFailed"
	default:
		phase, ready, reason = PhaseEnded, metav1.ConditionFalse, "SessionEnded"
	}
	st := map[string]any{
		"sessionId":          snap.ID,
		"phase":              phase,
		"node":               c.cfg.Identity,
		"expiresAt":          snap.ExpiresAt.UTC().Format(time.RFC3339),
		"credentialsSecret":  secretName,
		"endpoint":           map[string]any{"rest": c.restURL(snap.ID), "ssh": c.cfg.SSHUsername + "@" + snap.ID, "connectPath": "/v1/sessions/" + snap.ID},
		"observedGeneration": obj.GetGeneration(),
	}
	msg := "the session runs"
	if snap.StatusReason != "" {
		msg = snap.StatusReason
	} else if phase == PhaseEnded {
		msg = "the session " + snap.Status
	}
	return c.putStatus(ctx, res, obj, st, condition(obj, "Ready", ready, reason, msg))
}

// refresh brings the status of obj, whose session is id, up to date.
func (c *Controller) refresh(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, p gateway.Principal, id string) error {
	s, err := c.cfg.Sessions.Get(ctx, p, id)
	if errors.Is(err, gateway.ErrNotFound) {
		if phase, _, _ := unstructured.NestedString(obj.Object, "status", "phase"); phase == PhaseEnded || phase == PhaseFailed {
			return nil
		}
		st, _, _ := unstructured.NestedMap(obj.Object, "status")
		if node, _ := st["node"].(string); node != "" && node != c.cfg.Identity {
			// Made by another node agent, which is gone (this one leads
			// now) and took the session with it: a failure, not an end.
			st["phase"] = PhaseFailed
			return c.putStatus(ctx, res, obj, st, condition(obj, "Ready", metav1.ConditionFalse, "NodeLost",
				"the node agent "+node+" that held the session is gone"))
		}
		st["phase"] = PhaseEnded
		return c.putStatus(ctx, res, obj, st, condition(obj, "Ready", metav1.ConditionFalse, "SessionEnded", "the session is gone (its TTL passed, or it was deleted)"))
	}
	if err != nil {
		return err
	}
	st, _, _ := unstructured.NestedMap(obj.Object, "status")
	if st["phase"] == PhaseRunning && s.Live() && st["expiresAt"] == s.ExpiresAt().UTC().Format(time.RFC3339) {
		return nil
	}
	secretName, _ := st["credentialsSecret"].(string)
	return c.writeStatus(ctx, res, obj, s, secretName)
}

// fail marks obj failed for reason; the gateway is not asked again.
func (c *Controller) fail(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, reason, msg string) error {
	st := map[string]any{"phase": PhaseFailed, "observedGeneration": obj.GetGeneration()}
	return c.putStatus(ctx, res, obj, st, condition(obj, "Ready", metav1.ConditionFalse, reason, msg))
}

// secretProblem records a Secret that could not be read; a missing one
// is looked for again (it may be created later).
func (c *Controller) secretProblem(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, err error) error {
	st := map[string]any{"phase": PhasePending, "observedGeneration": obj.GetGeneration()}
	if perr := c.putStatus(ctx, res, obj, st, condition(obj, "Ready", metav1.ConditionFalse, "SecretNotFound", err.Error())); perr != nil {
		return perr
	}
	return err
}

// putStatus writes st, with cond among its conditions, as obj's status.
func (c *Controller) putStatus(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, st map[string]any, cond map[string]any) error {
	obj = obj.DeepCopy()
	old, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	st["conditions"] = setCondition(old, cond)
	obj.Object["status"] = st
	_, err := res.UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	return ignoreGone(err)
}

// finish ends obj's session and Secret, then lets the deletion go on.
func (c *Controller) finish(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, finalizer string, id, secretName string) error {
	if !slices.Contains(obj.GetFinalizers(), finalizer) {
		return nil
	}
	if id == "" {
		// A create may have made the session before its status was
		// written: the create's key finds it.
		if sid := c.sessionOfSecret(ctx, obj, secretName); sid != "" {
			id = sid
		}
	}
	if id != "" {
		// As the tenant the session was made for, not the namespace's
		// tenant now (its label may have changed since).
		p := c.principalFor(ctx, obj, id)
		if err := c.cfg.Sessions.Delete(ctx, p, id); err != nil && !errors.Is(err, gateway.ErrNotFound) {
			return fmt.Errorf("delete session %s: %w", id, err)
		}
	}
	c.cfg.Secrets.Drop(scopeOf(obj))
	// Owner references would collect it too, where a garbage collector
	// runs; the controller does not wait for one. A Secret of that name
	// that is not obj's is left alone.
	secrets := c.core.CoreV1().Secrets(obj.GetNamespace())
	sec, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
	if err == nil && ownedBy(sec, obj) {
		err = secrets.Delete(ctx, secretName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
	}
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	obj.SetFinalizers(slices.DeleteFunc(obj.GetFinalizers(), func(f string) bool { return f == finalizer }))
	_, err = res.Update(ctx, obj, metav1.UpdateOptions{})
	return ignoreGone(err)
}

func (c *Controller) sessionOfSecret(ctx context.Context, obj *unstructured.Unstructured, name string) string {
	s, err := c.core.CoreV1().Secrets(obj.GetNamespace()).Get(ctx, name, metav1.GetOptions{})
	if err != nil || !ownedBy(s, obj) {
		return ""
	}
	return string(s.Data["sessionId"])
}

// secretValue reads ref in namespace ns.
func (c *Controller) secretValue(ctx context.Context, ns string, ref SecretRef) (string, error) {
	s, err := c.core.CoreV1().Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("secret %s/%s: %w", ns, ref.Name, err)
	}
	v, ok := s.Data[ref.Key]
	if !ok {
		return "", fmt.Errorf("secret %s/%s has no key %q", ns, ref.Name, ref.Key)
	}
	return string(v), nil
}

// get reads ns/name of gvr from the informer's cache (nil: gone).
func (c *Controller) get(ns, name string, gvr schema.GroupVersionResource) (*unstructured.Unstructured, error) {
	o, err := c.dynInf.ForResource(gvr).Lister().ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	return u.DeepCopy(), nil
}

func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// convert decodes an unstructured value into v, by JSON.
func convert(in any, v any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// permanent reports whether another try of the same create fails the
// same way: a refused spec, not a full or failing gateway.
func permanent(ge *gateway.Error) bool {
	switch ge.Kind {
	case gateway.KindUnavailable, gateway.KindInternal, gateway.KindQuota, gateway.KindUpstream:
		return false
	}
	return true
}

// reasonOf turns an error code (quota_exceeded) into a condition reason
// (QuotaExceeded).
func reasonOf(code string) string {
	var b strings.Builder
	for w := range strings.SplitSeq(code, "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	if b.Len() == 0 {
		return "Failed"
	}
	return b.String()
}

// condition is a metav1.Condition as unstructured, keeping the old
// transition time when the status is unchanged.
func condition(obj *unstructured.Unstructured, typ string, status metav1.ConditionStatus, reason, msg string) map[string]any {
	return map[string]any{
		"type": typ, "status": string(status), "reason": reason, "message": msg,
		"observedGeneration": obj.GetGeneration(),
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}
}

// setCondition puts cond into conds, replacing one of its type (and
// keeping that one's transition time when the status did not change).
func setCondition(conds []any, cond map[string]any) []any {
	for i, o := range conds {
		m, ok := o.(map[string]any)
		if !ok || m["type"] != cond["type"] {
			continue
		}
		if m["status"] == cond["status"] {
			cond["lastTransitionTime"] = m["lastTransitionTime"]
		}
		conds[i] = cond
		return conds
	}
	return append(conds, cond)
}
