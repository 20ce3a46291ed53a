package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/rest/compat"
	"github.com/sandgate/sandgate/workspace"
)

// agentSandboxFlags are serve's settings of Agent Sandbox's API
// (/compat/agent-sandbox, docs/compat.md): the seed's SANDBOX_IMAGE,
// S3_PREFIX_ROOT, DELETE_S3_ON_CLEANUP and DELETE_S3_ON_DELETE.
type agentSandboxFlags struct {
	image           string
	prefix          string
	deleteOnCleanup bool
	deleteOnDelete  bool
}

func (a *agentSandboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.image, "agent-sandbox-image", "", "image of Agent Sandbox's sandboxes (/compat/agent-sandbox; the seed's SANDBOX_IMAGE): an image name a create may ask for (present, allowed by --image-allow, or an --image-alias); empty: the gateway's default image")
	fs.StringVar(&a.prefix, "agent-sandbox-s3-prefix", "sandboxes", "with --object-store, Agent Sandbox keeps each sandbox's files in the store too, at PREFIX/TENANT_KEY/USER_KEY/SESSION_KEY/PATH under the store's prefix (the seed's S3_PREFIX_ROOT)")
	fs.BoolVar(&a.deleteOnCleanup, "agent-sandbox-delete-on-cleanup", true, "with --object-store: delete an Agent Sandbox sandbox's stored files when it ends (stop, expiry, delete) (the seed's DELETE_S3_ON_CLEANUP)")
	fs.BoolVar(&a.deleteOnDelete, "agent-sandbox-delete-on-delete", false, "with --object-store: delete an Agent Sandbox sandbox's stored file once a sync finds the sandbox's copy deleted (the seed's DELETE_S3_ON_DELETE)")
}

// reservedStoreDirs are the top directories the workspace engine keeps
// under the object store's prefix (workspace/): Agent Sandbox's prefix
// stays out of them.
var reservedStoreDirs = []string{"tenants", "objects", "artifacts", "tombstones"}

// check refuses a prefix that is empty, climbs, or lies in the
// workspace engine's part of the store.
func (a *agentSandboxFlags) check() error {
	p := strings.Trim(a.prefix, "/")
	if p == "" {
		return fmt.Errorf("--agent-sandbox-s3-prefix must not be empty")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("--agent-sandbox-s3-prefix %q: want slash-separated names, without empty, . or .. parts", a.prefix)
		}
	}
	first, _, _ := strings.Cut(p, "/")
	for _, d := range reservedStoreDirs {
		if first == d {
			return fmt.Errorf("--agent-sandbox-s3-prefix %q: %s/ is the workspace store's own; choose another prefix", a.prefix, d)
		}
	}
	a.prefix = p
	return nil
}

// checkImage refuses an --agent-sandbox-image no create could get, as
// far as the flags tell (serve checks the image store too, checkImageIn):
// not a reference, or, on the workdir driver, anything but the default
// image and its aliases. needsStore says the image is neither one nor
// allowed to be pulled, so it must be present in the store.
func (a *agentSandboxFlags) checkImage(c *serveConfig) (needsStore bool, err error) {
	if a.image == "" {
		return false, nil
	}
	n, err := images.Normalize(a.image)
	if err != nil {
		return false, fmt.Errorf("--agent-sandbox-image %q: not an image reference: %w", a.image, err)
	}
	defaults, aliases, err := parseImageAliases(c.imageAlias)
	if err != nil {
		return false, err
	}
	for _, d := range defaults {
		if a.image == d || n == d {
			return false, nil
		}
	}
	if _, ok := aliases[n]; ok {
		return false, nil
	}
	if c.sandboxDriver == "workdir" {
		return false, fmt.Errorf("--agent-sandbox-image %q: the workdir driver runs no images; leave it empty (the default image) or make it an alias of it (--image-alias %s=default)", a.image, a.image)
	}
	if c.imagePull == "missing" && images.Allowed(n, c.imageAllow) {
		return false, nil
	}
	return true, nil
}

// checkImageIn is checkImage's rest, once the image store is open: an
// image neither an alias nor allowed to be pulled must be present.
func (a *agentSandboxFlags) checkImageIn(c *serveConfig, isrc *imageSource) error {
	needsStore, err := a.checkImage(c)
	if err != nil || !needsStore {
		return err
	}
	if err := isrc.Check(a.image); err != nil {
		return usageErrorf("--agent-sandbox-image %q: no create could get it: %v (import it with `sandgate image`, allow it with --image-allow, or make it an --image-alias)", a.image, err)
	}
	return nil
}

// config is Agent Sandbox's configuration: with --object-store, its
// files are kept in the same store (its own client of it).
func (a *agentSandboxFlags) config(w *workspaceFlags) (compat.AgentSandboxConfig, error) {
	cfg := compat.AgentSandboxConfig{Image: a.image, Prefix: a.prefix, DeleteOnCleanup: a.deleteOnCleanup, DeleteOnDelete: a.deleteOnDelete}
	if w.objectStore == "" {
		return cfg, nil
	}
	b, err := workspace.NewS3Backend(workspace.S3Config{URL: w.objectStore, Endpoint: w.endpoint, Region: w.region}, os.Getenv)
	if err != nil {
		return cfg, err
	}
	store, ok := b.(compat.ObjectStore)
	if !ok {
		return cfg, fmt.Errorf("the object store cannot presign download URLs")
	}
	cfg.Store = store
	return cfg, nil
}
