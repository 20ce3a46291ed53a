package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
)

// imageSource is the image store as the session manager
// (gateway.ImageSource) and the API (rest.Images) see it: images present,
// and those --image-allow lets a create pull on demand.
type imageSource struct {
	store    *images.Store
	allow    []string // normalised patterns
	pull     bool     // --image-pull=missing
	insecure []string
	log      *slog.Logger
	// noImages is set when the sandbox driver cannot run images (workdir):
	// every image is refused before anything is pulled.
	noImages bool
	// aliases maps the normalised names of --image-alias to the normalised
	// images they stand for.
	aliases map[string]string
	// aliasList is --image-alias as GET /v1/images lists it: each name as
	// given, with the image it stands for, in the flags' order.
	aliasList []rest.ImageAlias
	// pulls bounds each tenant's on-demand pulls at once
	// (--image-pulls-per-tenant).
	pulls tenantPulls
}

// defaultImage is the name of the host-root image, the one a create
// without an image gets.
const defaultImage = "default"

// parseImageAliases reads --image-alias NAME=REF values: the names of
// the host-root image (default first, then each alias of default as given
// and normalised), and the other aliases, normalised name to normalised
// image.
func parseImageAliases(values []string) (defaults []string, aliases map[string]string, err error) {
	defaults, aliases = []string{defaultImage}, map[string]string{}
	for _, v := range values {
		name, target, ok := strings.Cut(v, "=")
		name, target = strings.TrimSpace(name), strings.TrimSpace(target)
		if !ok || name == "" || target == "" {
			return nil, nil, fmt.Errorf("--image-alias %q: want NAME=REF (REF an image, or default)", v)
		}
		n, err := images.Normalize(name)
		if err != nil {
			return nil, nil, fmt.Errorf("--image-alias %q: %w", v, err)
		}
		if target == defaultImage {
			defaults = append(defaults, name)
			if n != name {
				defaults = append(defaults, n)
			}
			continue
		}
		if aliases[n], err = images.Normalize(target); err != nil {
			return nil, nil, fmt.Errorf("--image-alias %q: %w", v, err)
		}
	}
	return defaults, aliases, nil
}

// imageAliasNames are the names --image-alias values give (NAME of
// NAME=REF, as given): E2B templates of these names get their image
// (rest/compat/e2b).
func imageAliasNames(values []string) []string {
	var names []string
	for _, v := range values {
		if name, _, ok := strings.Cut(v, "="); ok && strings.TrimSpace(name) != "" {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

// setAliases takes --image-alias's values and logs each (a warning for
// an image that is neither present nor may be pulled). It returns the
// names of the host-root image, for the session manager's Config.Images.
func (s *imageSource) setAliases(values []string) ([]string, error) {
	defaults, aliases, err := parseImageAliases(values)
	if err != nil {
		return nil, err
	}
	s.aliases = aliases
	s.aliasList = make([]rest.ImageAlias, 0, len(values))
	for _, v := range values {
		name, target, _ := strings.Cut(v, "=")
		name, target = strings.TrimSpace(name), strings.TrimSpace(target)
		if target != defaultImage {
			target, _ = images.Normalize(target) // parseImageAliases has checked it
		}
		s.aliasList = append(s.aliasList, rest.ImageAlias{Name: name, Image: target})
	}
	for _, name := range defaults[1:] {
		s.log.Info("image_alias", "name", name, "image", defaultImage)
	}
	for n, t := range aliases {
		if err := s.Check(t); err != nil {
			s.log.Warn("image_alias", "name", n, "image", t, "problem", err.Error())
			continue
		}
		s.log.Info("image_alias", "name", n, "image", t)
	}
	return defaults, nil
}

// alias is what n (normalised) stands for: its --image-alias target, or n.
func (s *imageSource) alias(n string) string {
	if t, ok := s.aliases[n]; ok {
		return t
	}
	return n
}

func newImageSource(store *images.Store, allow []string, pull bool, insecure []string, log *slog.Logger) (*imageSource, error) {
	for _, p := range allow {
		if err := images.CheckPattern(p); err != nil {
			return nil, fmt.Errorf("--image-allow %q: %w", p, err)
		}
	}
	return &imageSource{store: store, allow: allow, pull: pull, insecure: insecure, log: log}, nil
}

func (s *imageSource) unknown(name, why string) error {
	allowed := "none: the operator pulls or imports images with `sandgate image`"
	if s.pull && len(s.allow) > 0 {
		allowed = strings.Join(s.allow, ", ")
	}
	return gateway.Invalid("unknown_image", fmt.Sprintf("image %q %s; images that may be pulled on demand: %s (GET /v1/images lists those present)", name, why, allowed))
}

// normalize is images.Normalize with its error as the API's.
func normalize(name string) (string, error) {
	n, err := images.Normalize(name)
	if err != nil {
		return "", gateway.Invalid("unknown_image", fmt.Sprintf("image %q is not a valid reference: %v", name, err))
	}
	return n, nil
}

// Check implements gateway.ImageSource.
func (s *imageSource) Check(name string) error {
	if s.noImages {
		return gateway.Invalid("images_unsupported", sandbox.ErrNoImages.Error())
	}
	n, err := normalize(name)
	if err != nil {
		return err
	}
	n = s.alias(n)
	if _, err := s.store.Get(n); err == nil {
		return nil
	} else if !errors.Is(err, images.ErrNotFound) {
		return &gateway.Error{Kind: gateway.KindInternal, Code: "internal", Message: "internal error", Err: err}
	}
	if s.pull && images.Allowed(n, s.allow) {
		return nil
	}
	return s.unknown(name, "is not on this gateway and may not be pulled")
}

// Resolve implements gateway.ImageSource: the image, pulled first when it
// is missing and allowed. The pull outlives the create that asked for it
// (other creates may share it), up to the store's pull deadline
// (--image-pull-timeout).
func (s *imageSource) Resolve(ctx context.Context, name string) (*sandbox.Image, error) {
	n, err := normalize(name)
	if err != nil {
		return nil, err
	}
	n = s.alias(n)
	img, err := s.store.Get(n)
	if errors.Is(err, images.ErrNotFound) {
		if !s.pull || !images.Allowed(n, s.allow) {
			return nil, s.unknown(name, "is not on this gateway and may not be pulled")
		}
		p, _ := gateway.PrincipalFrom(ctx)
		done, err := s.pulls.acquire(p.Tenant, n)
		if err != nil {
			return nil, err
		}
		defer done()
		start := time.Now()
		img, err = s.store.Pull(context.WithoutCancel(ctx), n, images.PullOptions{InsecureRegistries: s.insecure,
			Progress: pullLogger(s.log, n, start)})
		if err != nil {
			s.log.Warn("image_pull_failed", "image", n, "err", err)
			return nil, pullError(n, err)
		}
		s.log.Info("image_pulled", "image", n, "digest", img.Digest, "bytes", img.SizeBytes, "duration", time.Since(start).Round(time.Millisecond).String())
	} else if err != nil {
		return nil, &gateway.Error{Kind: gateway.KindInternal, Code: "internal", Message: "internal error", Err: err}
	}
	return &sandbox.Image{Name: img.Name, Digest: img.Digest, Layers: img.LayerDirs, Env: img.Env, WorkingDir: img.WorkingDir}, nil
}

// pullLogger logs an on-demand pull's progress in a few lines: when it
// starts, at each quarter, and every 15 s while it is slow.
func pullLogger(log *slog.Logger, name string, start time.Time) func(images.Progress) {
	var quarter int
	var last time.Time
	return func(p images.Progress) {
		q, now := 0, time.Now()
		if p.Total > 0 {
			q = int(4 * p.Complete / p.Total)
		}
		switch {
		case last.IsZero():
			log.Info("image_pull_started", "image", name, "layers", p.Layers, "bytes", p.Total)
		case q > quarter && q < 4, now.Sub(last) >= 15*time.Second && p.Complete < p.Total:
			log.Info("image_pull_progress", "image", name, "percent", 100*p.Complete/max(p.Total, 1),
				"complete_bytes", p.Complete, "bytes", p.Total, "elapsed", now.Sub(start).Round(time.Second).String())
		default:
			return
		}
		quarter, last = q, now
	}
}

// pullError is a failed pull as the API answers it: a bound crossed has
// its own code, anything else is the registry's (image_pull_failed).
func pullError(name string, err error) error {
	msg := fmt.Sprintf("could not pull %s: %v", name, err)
	switch {
	case errors.Is(err, images.ErrTooLarge):
		return &gateway.Error{Kind: gateway.KindInvalid, Code: "image_too_large", Message: msg, Err: err}
	case errors.Is(err, images.ErrStoreFull):
		// The host's disk figures stay in the log.
		return &gateway.Error{Kind: gateway.KindUnavailable, Code: "image_store_full", Err: err,
			Message: fmt.Sprintf("could not pull %s: the gateway's image store is full (its quota, or its disk's free space); the operator can prune images", name)}
	case errors.Is(err, images.ErrPullTimeout):
		return &gateway.Error{Kind: gateway.KindUpstream, Code: "image_pull_timeout", Message: msg, Err: err}
	}
	return &gateway.Error{Kind: gateway.KindUpstream, Code: "image_pull_failed", Message: msg, Err: err}
}

// Hold implements gateway.ImageSource: the hold is of img's digest. The
// store holds what the name is now; when it was pulled again since img
// was resolved (a warm pool's builds come long after), that is another
// image, whose layers the hold would keep instead of img's: refused.
func (s *imageSource) Hold(id string, img *sandbox.Image) error {
	return s.hold(id, img, s.store.Acquire)
}

// HoldWarm implements gateway.ImageSource: Hold for a warm sandbox, which
// `image rm` does not wait for (images.Store.AcquireWarm).
func (s *imageSource) HoldWarm(id string, img *sandbox.Image) error {
	return s.hold(id, img, s.store.AcquireWarm)
}

func (s *imageSource) hold(id string, img *sandbox.Image, acquire func(id, name string) (images.Image, error)) error {
	got, err := acquire(id, img.Name)
	if err != nil {
		return err
	}
	if got.Digest != img.Digest {
		s.Release(id)
		return fmt.Errorf("image %s is %s now, not %s: it was pulled again", img.Name, got.Digest, img.Digest)
	}
	return nil
}

// Release implements gateway.ImageSource.
func (s *imageSource) Release(id string) {
	if err := s.store.Release(id); err != nil {
		s.log.Warn("image_release_failed", "session", id, "err", err)
	}
}

// ImageAliases implements rest.ImageAliases.
func (s *imageSource) ImageAliases() []rest.ImageAlias { return s.aliasList }

// ListImages implements rest.Images.
func (s *imageSource) ListImages(context.Context) ([]rest.ImageInfo, []string, error) {
	list, err := s.store.List()
	if err != nil {
		return nil, nil, err
	}
	out := make([]rest.ImageInfo, 0, len(list))
	for _, img := range list {
		out = append(out, rest.ImageInfo{Name: img.Name, Digest: img.Digest, SizeBytes: img.SizeBytes, PulledAt: img.PulledAt})
	}
	allow := []string{}
	if s.pull {
		allow = append(allow, s.allow...)
	}
	return out, allow, nil
}

// releaseStaleImageRefs drops the image holds of sessions the manager does
// not know after Restore (a crash between a sandbox's end and its release),
// so that `image rm` and prune are not blocked forever.
func releaseStaleImageRefs(store *images.Store, mgr *gateway.Manager, log *slog.Logger) {
	refs, err := store.Refs()
	if err != nil {
		log.Warn("image_refs_unreadable", "err", err)
		return
	}
	for _, r := range refs {
		if !mgr.Known(r.SessionID) {
			if err := store.Release(r.SessionID); err != nil {
				log.Warn("image_release_failed", "session", r.SessionID, "err", err)
				continue
			}
			log.Info("image_ref_released", "session", r.SessionID, "image", r.Name, "reason", "no such session")
		}
	}
}

// DefaultImagePullsPerTenant is --image-pulls-per-tenant's default.
const DefaultImagePullsPerTenant = 4

// tenantPulls bounds the distinct images each tenant has being pulled on
// demand at once: creates of an image the tenant is pulling already wait
// for that pull and count nothing more. Its zero value allows
// DefaultImagePullsPerTenant.
type tenantPulls struct {
	max int // <= 0: DefaultImagePullsPerTenant

	mu      sync.Mutex
	pulling map[string]map[string]int // tenant -> image -> creates waiting on it
}

// acquire counts a create of tenant waiting on a pull of image; done
// gives it back. Past the bound it is a 429 too_many_image_pulls.
func (t *tenantPulls) acquire(tenant, image string) (done func(), err error) {
	limit := t.max
	if limit <= 0 {
		limit = DefaultImagePullsPerTenant
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	mine := t.pulling[tenant]
	if mine[image] == 0 && len(mine) >= limit {
		return nil, &gateway.Error{Kind: gateway.KindQuota, Code: "too_many_image_pulls", RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("your tenant is pulling %d images already (at most %d at once; serve --image-pulls-per-tenant): create once one of them is in, or use an image present (GET /v1/images)", len(mine), limit)}
	}
	if mine == nil {
		if t.pulling == nil {
			t.pulling = map[string]map[string]int{}
		}
		mine = map[string]int{}
		t.pulling[tenant] = mine
	}
	mine[image]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if mine[image]--; mine[image] <= 0 {
			delete(mine, image)
		}
		if len(mine) == 0 {
			delete(t.pulling, tenant)
		}
	}, nil
}

// inFlight is how many images tenant is pulling now.
func (t *tenantPulls) inFlight(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pulling[tenant])
}
