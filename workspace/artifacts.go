package workspace

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"os"
	"path"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// presigner is a remote store that can hand out read links (s3Backend).
type presigner interface {
	PresignGet(ctx context.Context, key string, ttl time.Duration, params url.Values) (string, error)
}

// artifactReuse is how long an uploaded artifact is linked again without
// a new upload. A PUT restarts the object's age, so a link handed out
// lives artifactReuse plus its ttl after the upload: far less than the
// day that is an S3 lifecycle rule's shortest expiry.
const artifactReuse = time.Hour

func (s *Service) recentArtifact(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.uploaded[key]
	return ok && time.Since(t) < artifactReuse
}

// ErrNoPresign: no object store that can presign is configured.
var ErrNoPresign = errors.New("no object store that presigns links")

// PresignArtifact uploads the file rel (relative to sb's /workspace; a
// final symlink is followed, within the workspace) to the object store,
// by content, and returns a presigned URL that reads it for ttl: what the
// file holds now, unlike the gateway's own links, which read it afresh.
func (s *Service) PresignArtifact(ctx context.Context, sb sandbox.Sandbox, rel string, ttl time.Duration) (string, error) {
	p, ok := s.cfg.Remote.(presigner)
	if !ok {
		return "", ErrNoPresign
	}
	pins := &pinSet{} // the object is named by no doc
	defer s.unpin(pins)
	home := homeOf(sb)
	root, err := os.OpenRoot(home)
	if err != nil {
		return "", err
	}
	defer root.Close()
	fe, _, err := s.storeFileFlags(ctx, root, rel, os.O_RDONLY|syscall.O_NONBLOCK, false, s.limitFor(home), pins)
	if err != nil {
		return "", err
	}
	hash := fe.Hash
	// Artifacts have keys of their own: no collection removes them (an
	// object store's lifecycle rule may expire artifacts/, so an upload
	// is reused for artifactReuse only).
	key := "artifacts/" + hash
	if !s.recentArtifact(key) {
		f, err := os.Open(s.local.dir + "/" + objectKey(hash))
		if err != nil {
			return "", err
		}
		st, err := f.Stat()
		if err == nil {
			err = s.cfg.Remote.Put(ctx, key, f, st.Size())
		}
		f.Close()
		if err != nil {
			return "", err
		}
		s.mu.Lock()
		now := time.Now()
		for k, t := range s.uploaded {
			if now.Sub(t) >= artifactReuse {
				delete(s.uploaded, k)
			}
		}
		s.uploaded[key] = now
		s.mu.Unlock()
	}
	params := url.Values{}
	params.Set("response-content-disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(rel)}))
	if t := mime.TypeByExtension(path.Ext(rel)); t != "" {
		params.Set("response-content-type", t)
	}
	u, err := p.PresignGet(ctx, key, ttl, params)
	if err != nil {
		return "", fmt.Errorf("presign: %w", err)
	}
	return u, nil
}
