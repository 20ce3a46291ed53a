package kube

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/gateway"
)

// Annotations (on a SandboxClaim, or on its SandboxWarmPool or
// SandboxTemplate, the claim's winning) that shape a claim's session.
const (
	// AnnotationImage is the session's image (REST's image).
	AnnotationImage = "sandgate.dev/image"
	// AnnotationEgress is the egress allow-list, comma-separated.
	AnnotationEgress = "sandgate.dev/egress"
	// AnnotationSecrets are secrets from Kubernetes Secrets of the
	// claim's namespace, comma-separated NAME=secret/key: NAME is the
	// environment variable.
	AnnotationSecrets = "sandgate.dev/secrets"
	// AnnotationTTL is the session's lifetime in seconds when the claim
	// has no lifecycle.shutdownTime.
	AnnotationTTL = "sandgate.dev/ttl"
)

// claimSecretSuffix ends the name of the Secret a claim owns.
const claimSecretSuffix = "-sandgate"

// marked reports whether obj carries RuntimeKey: RuntimeValue as a label
// or an annotation.
func marked(obj *unstructured.Unstructured) bool {
	return obj != nil && (obj.GetLabels()[RuntimeKey] == RuntimeValue || obj.GetAnnotations()[RuntimeKey] == RuntimeValue)
}

// claimSources are what a claim's session is made from: the claim, its
// warm pool and the pool's template (nil when absent).
type claimSources struct{ claim, pool, template *unstructured.Unstructured }

// annotation is key's value on the claim, else the pool, else the template.
func (s claimSources) annotation(key string) string {
	for _, o := range []*unstructured.Unstructured{s.claim, s.pool, s.template} {
		if o != nil {
			if v, ok := o.GetAnnotations()[key]; ok {
				return v
			}
		}
	}
	return ""
}

// sources finds claim's pool and template; ours is false when neither is
// marked for sandgate (agent-sandbox's controller then owns the claim).
func (c *Controller) sources(claim *unstructured.Unstructured) (s claimSources, ours bool, err error) {
	s.claim = claim
	pool, _, _ := unstructured.NestedString(claim.Object, "spec", "warmPoolRef", "name")
	if pool == "" {
		return s, false, nil
	}
	if s.pool, err = c.get(claim.GetNamespace(), pool, WarmPoolGVR); err != nil || s.pool == nil {
		return s, false, err
	}
	if tpl, _, _ := unstructured.NestedString(s.pool.Object, "spec", "sandboxTemplateRef", "name"); tpl != "" {
		if s.template, err = c.get(claim.GetNamespace(), tpl, TemplateGVR); err != nil {
			return s, false, err
		}
	}
	return s, marked(s.pool) || marked(s.template), nil
}

func (c *Controller) reconcileClaim(ctx context.Context, ns, name string) error {
	claim, err := c.get(ns, name, ClaimGVR)
	if claim == nil || err != nil {
		return err
	}
	res := c.dyn.Resource(ClaimGVR).Namespace(ns)
	id, _, _ := unstructured.NestedString(claim.Object, "status", "sandbox", "name")
	secretName := credentialsSecret(claim, claimSecretSuffix)
	if claim.GetDeletionTimestamp() != nil {
		return c.finish(ctx, res, claim, claimFinalizer, id, secretName)
	}
	p := c.principalFor(ctx, claim, id)
	src, ours, err := c.sources(claim)
	if err != nil {
		return err
	}
	if !ours && !slices.Contains(claim.GetFinalizers(), claimFinalizer) {
		return nil
	}
	if !slices.Contains(claim.GetFinalizers(), claimFinalizer) {
		claim.SetFinalizers(append(claim.GetFinalizers(), claimFinalizer))
		if claim, err = res.Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return ignoreGone(err)
		}
		src.claim = claim
	}
	if id != "" {
		if err := c.reloadClaimSecrets(ctx, src, p, id); err != nil {
			return err
		}
		return c.refreshClaim(ctx, claim, p, id)
	}
	if failed(claim) {
		return nil
	}
	cp, err := c.claimParams(ctx, src)
	if err != nil {
		if ge, ok := errors.AsType[*gateway.Error](err); ok {
			return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, reasonOf(ge.Code), ge.Message)
		}
		return err
	}
	cp.IdempotencyKey = scopeOf(claim)
	s, pw, err := c.cfg.Sessions.Create(ctx, p, cp)
	if err != nil {
		if ge, ok := errors.AsType[*gateway.Error](err); ok && permanent(ge) {
			c.cfg.Secrets.Drop(cp.SecretScope)
			return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, reasonOf(ge.Code), ge.Message)
		}
		return err
	}
	if pw != "" {
		extra := map[string]string{"token": pw, "sandboxId": s.ID}
		if err := c.writeCredentials(ctx, claim, secretName, s.ID, pw, extra); err != nil {
			_ = c.cfg.Sessions.Delete(context.WithoutCancel(ctx), p, s.ID)
			if errors.Is(err, errSecretTaken) {
				c.cfg.Secrets.Drop(cp.SecretScope)
				return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, "SecretConflict", err.Error())
			}
			return err
		}
	} else if c.sessionOfSecret(ctx, claim, secretName) != s.ID {
		_ = c.cfg.Sessions.Delete(context.WithoutCancel(ctx), p, s.ID)
		return fmt.Errorf("session %s: credentials Secret %s missing", s.ID, secretName)
	}
	return c.claimStatus(ctx, claim, s.ID, metav1.ConditionTrue, "DependenciesReady", "sandgate session "+s.ID+" on "+c.cfg.Identity)
}

// failed reports whether claim's Ready condition is False for a reason
// that another pass would not change (a refused spec).
func failed(claim *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(claim.Object, "status", "conditions")
	for _, o := range conds {
		m, _ := o.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "False" && m["reason"] != "SandboxMissing" && m["reason"] != "SecretNotFound" {
			return true
		}
	}
	return false
}

// claimParams is the create a claim asks for.
func (c *Controller) claimParams(ctx context.Context, src claimSources) (gateway.CreateParams, error) {
	claim := src.claim
	cp := gateway.CreateParams{
		Image:    src.annotation(AnnotationImage),
		Metadata: map[string]any{"kubernetes": map[string]any{"namespace": claim.GetNamespace(), "name": claim.GetName(), "kind": "SandboxClaim"}},
	}
	if v := src.annotation(AnnotationEgress); v != "" {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				cp.Egress = append(cp.Egress, e)
			}
		}
	}
	if t, ok, _ := unstructured.NestedString(claim.Object, "spec", "lifecycle", "shutdownTime"); ok && t != "" {
		at, err := time.Parse(time.RFC3339, t)
		if err != nil {
			return cp, gateway.Invalid("invalid_ttl", "lifecycle.shutdownTime: "+err.Error())
		}
		cp.TTL = clampTTL(math.Ceil(time.Until(at).Seconds()))
	} else if v := src.annotation(AnnotationTTL); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cp, gateway.Invalid("invalid_ttl", AnnotationTTL+": "+err.Error())
		}
		cp.TTL = n
	}
	env, _, _ := unstructured.NestedSlice(claim.Object, "spec", "env")
	if len(env) > 0 {
		if src.template != nil {
			if pol, _, _ := unstructured.NestedString(src.template.Object, "spec", "envVarsInjectionPolicy"); pol == "Disallowed" {
				return cp, gateway.Invalid("env_vars_injection_rejected", "the SandboxTemplate's envVarsInjectionPolicy is Disallowed")
			}
		}
		cp.Env = map[string]string{}
		for _, o := range env {
			m, _ := o.(map[string]any)
			n, _ := m["name"].(string)
			v, _ := m["value"].(string)
			cp.Env[n] = v
		}
	}
	if v := src.annotation(AnnotationSecrets); v != "" {
		vals, names, err := c.claimSecrets(ctx, claim, v)
		if err != nil {
			return cp, err
		}
		for _, n := range names {
			cp.Secrets = append(cp.Secrets, gateway.SecretRef{Name: n})
		}
		// The values are this claim's session's alone.
		cp.SecretScope = scopeOf(claim)
		c.cfg.Secrets.Set(cp.SecretScope, vals)
	}
	return cp, nil
}

// claimSecrets reads the values the secrets annotation v of claim names
// (names in the annotation's order).
func (c *Controller) claimSecrets(ctx context.Context, claim *unstructured.Unstructured, v string) (vals map[string]string, names []string, err error) {
	vals = map[string]string{}
	for e := range strings.SplitSeq(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		n, ref, ok := strings.Cut(e, "=")
		sec, key, ok2 := strings.Cut(ref, "/")
		if !ok || !ok2 || n == "" || sec == "" || key == "" {
			return nil, nil, gateway.Invalid("invalid_secret", fmt.Sprintf("%s: want NAME=secret/key, got %q", AnnotationSecrets, e))
		}
		val, err := c.secretValue(ctx, claim.GetNamespace(), SecretRef{Name: sec, Key: key})
		if err != nil {
			return nil, nil, &gateway.Error{Kind: gateway.KindNotFound, Code: "secret_not_found", Message: err.Error()}
		}
		vals[n] = val
		names = append(names, n)
	}
	return vals, names, nil
}

// reloadClaimSecrets is reloadSessionSecrets for a claim whose session id
// exists.
func (c *Controller) reloadClaimSecrets(ctx context.Context, src claimSources, p gateway.Principal, id string) error {
	v := src.annotation(AnnotationSecrets)
	if v == "" || c.cfg.Secrets.Has(scopeOf(src.claim)) {
		return nil
	}
	if _, err := c.cfg.Sessions.Get(ctx, p, id); err != nil {
		return nil // gone: refreshClaim says so
	}
	vals, _, err := c.claimSecrets(ctx, src.claim, v)
	if err != nil {
		return fmt.Errorf("claim session %s: reading its secrets again: %w", id, err) // retried
	}
	c.cfg.Secrets.Set(scopeOf(src.claim), vals)
	return nil
}

// clampTTL keeps a claim's remaining lifetime within the gateway's bounds.
func clampTTL(s float64) int {
	return int(max(min(s, gateway.MaxTTL), gateway.MinTTL))
}

// claimStatus writes a claim's status as agent-sandbox's API has it: the
// Ready condition and status.sandbox.name (the session's id, which is
// what X-Sandbox-ID names).
func (c *Controller) claimStatus(ctx context.Context, claim *unstructured.Unstructured, id string, ready metav1.ConditionStatus, reason, msg string) error {
	claim = claim.DeepCopy()
	st, _, _ := unstructured.NestedMap(claim.Object, "status")
	if st == nil {
		st = map[string]any{}
	}
	if id != "" {
		st["sandbox"] = map[string]any{"name": id}
	}
	conds, _ := st["conditions"].([]any)
	st["conditions"] = setCondition(conds, condition(claim, "Ready", ready, reason, msg))
	claim.Object["status"] = st
	_, err := c.dyn.Resource(ClaimGVR).Namespace(claim.GetNamespace()).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	return ignoreGone(err)
}

// refreshClaim marks a claim whose session is gone not ready.
func (c *Controller) refreshClaim(ctx context.Context, claim *unstructured.Unstructured, p gateway.Principal, id string) error {
	s, err := c.cfg.Sessions.Get(ctx, p, id)
	switch {
	case errors.Is(err, gateway.ErrNotFound) || (err == nil && !s.Live()):
		if ready(claim) == "False" {
			return nil
		}
		return c.claimStatus(ctx, claim, id, metav1.ConditionFalse, "SandboxMissing", "the sandgate session "+id+" is gone")
	case err != nil:
		return err
	}
	return nil
}

func ready(obj *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, o := range conds {
		if m, _ := o.(map[string]any); m["type"] == "Ready" {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}
