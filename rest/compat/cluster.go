package compat

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// maxCompatPeek bounds what SessionOf reads of a body to find the
// session it names; a larger body is left to the node that receives it.
const maxCompatPeek = 1 << 20

// SessionOf names the session a request of a compatibility API is
// for, so that a cluster node relays it to the session's owner: by id
// (sbs and Sandkasten name the native session in their paths) or by the
// native session name (Agent Sandbox names its sandbox after user_id and
// session_id, in the body or the query: name finds it, to be called once
// the request is authenticated). token is the credential the API takes in
// a header of its own (Agent Sandbox's X-API-Key), "" when the request has
// none.
func SessionOf(r *http.Request) (id, token string, name func() string) {
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/compat/sbs/sessions/"); ok {
		id, _, _ = strings.Cut(rest, "/")
		return id, "", nil
	}
	if rest, ok := strings.CutPrefix(p, "/compat/sandkasten/v1/sessions/"); ok {
		id, _, _ = strings.Cut(rest, "/")
		return id, "", nil
	}
	if strings.HasPrefix(p, SandboxRouterPrefix+"/") || p == SandboxRouterPrefix {
		return r.Header.Get(SandboxIDHeader), "", nil
	}
	if id, ok := e2bSessionOf(r); ok {
		// E2B's SDKs send the API key as X-API-Key; the sandbox URL's own
		// access token is checked by the owner only (docs/compat.md).
		return id, strings.TrimSpace(r.Header.Get("X-API-Key")), nil
	}
	if !strings.HasPrefix(p, "/compat/agent-sandbox/") {
		return "", "", nil
	}
	return "", strings.TrimSpace(r.Header.Get("X-API-Key")), func() string { return agentSandboxNameOf(r) }
}

// OwnerCredential reports whether r is an E2B sandbox-URL call that
// carries the sandbox's own access token (X-Access-Token or
// E2B-Traffic-Access-Token): the token is keyed by the node that holds
// the sandbox, so only that node can check it (cluster.FrontConfig's
// OwnerCredential).
func OwnerCredential(r *http.Request) bool {
	p := r.URL.Path
	if p != "/compat/e2b/sandbox" && !strings.HasPrefix(p, "/compat/e2b/sandbox/") {
		return false
	}
	return r.Header.Get("X-Access-Token") != "" || r.Header.Get("E2B-Traffic-Access-Token") != ""
}

// e2bSessionOf is the sandbox an E2B request names: in its path (the
// control API's /sandboxes/{id}...) or in E2b-Sandbox-Id (the sandbox
// URL). Only sandgate's ids count: /sandboxes/metrics names none.
func e2bSessionOf(r *http.Request) (string, bool) {
	p := r.URL.Path
	var id string
	switch {
	case p == "/compat/e2b/sandbox" || strings.HasPrefix(p, "/compat/e2b/sandbox/"):
		id = r.Header.Get("E2b-Sandbox-Id")
	case strings.HasPrefix(p, "/compat/e2b/sandboxes/"):
		id, _, _ = strings.Cut(strings.TrimPrefix(p, "/compat/e2b/sandboxes/"), "/")
	case strings.HasPrefix(p, "/compat/e2b/v2/sandboxes/"):
		id, _, _ = strings.Cut(strings.TrimPrefix(p, "/compat/e2b/v2/sandboxes/"), "/")
	default:
		return "", false
	}
	return id, strings.HasPrefix(id, "sbx-")
}

// agentSandboxNameOf is the native name of the sandbox an Agent Sandbox
// request is for ("" when it names none validly: the API answers it). A
// POST body read here is put back, unchanged.
func agentSandboxNameOf(r *http.Request) string {
	var ident struct {
		UserID    string  `json:"user_id"`
		SessionID *string `json:"session_id"`
	}
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		ident.UserID = q.Get("user_id")
		if q.Has("session_id") {
			s := q.Get("session_id")
			ident.SessionID = &s
		}
	case http.MethodPost:
		if r.Body == nil {
			return ""
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, maxCompatPeek+1))
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
		if err != nil || len(b) > maxCompatPeek || json.Unmarshal(b, &ident) != nil {
			return "" // the API answers it as it would
		}
	default:
		return ""
	}
	who, err := agentIdentityOf(ident.UserID, ident.SessionID)
	if err != nil {
		return ""
	}
	return who.name()
}
