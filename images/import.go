package images

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Import stores the image at path under name (normalised as Normalize
// does). path is an OCI image layout directory, a tar of one (an
// oci-archive), or a `docker save` tar; a layout or archive with several
// images gives the one for the store's platform. Layers are verified
// against the manifest's digests (layouts) or the config's diffIDs (both).
// A failed import leaves nothing behind, as a failed Pull.
func (s *Store) Import(ctx context.Context, name, path string) (Image, error) {
	n, err := Normalize(name)
	if err != nil {
		return Image{}, err
	}
	if strings.Contains(n, "@") {
		return Image{}, fmt.Errorf("import as %s: the name must be a tag, not a digest", n)
	}
	gc, err := s.lockGC()
	if err != nil {
		return Image{}, err
	}
	defer gc.unlock()
	img, err := s.importImage(ctx, gc, n, path)
	if err != nil {
		return Image{}, fmt.Errorf("import %s as %s: %w", path, n, err)
	}
	return img, nil
}

func (s *Store) importImage(ctx context.Context, gc *fileLock, name, p string) (Image, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return Image{}, err
	}
	if fi.IsDir() {
		return s.importLayout(ctx, gc, name, p)
	}
	kind, err := archiveKind(p)
	if err != nil {
		return Image{}, err
	}
	switch kind {
	case "oci":
		// go-containerregistry reads layouts from directories: unpack the
		// archive's files (regular files and directories only) into tmp/.
		dir, err := os.MkdirTemp(s.tmpDir(), "import-")
		if err != nil {
			return Image{}, err
		}
		defer os.RemoveAll(dir)
		if err := extractLayout(p, dir); err != nil {
			return Image{}, fmt.Errorf("reading oci-archive: %w", err)
		}
		return s.importLayout(ctx, gc, name, dir)
	case "docker":
		img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(p) }, nil)
		if err != nil {
			return Image{}, fmt.Errorf("reading docker save archive: %w", err)
		}
		rec, err := s.store(ctx, gc, name, "import", img, uncompressedDigest, nil)
		if err != nil {
			return Image{}, err
		}
		return s.image(rec), nil
	}
	return Image{}, errors.New("not an OCI image layout, oci-archive or docker save tar (no oci-layout or manifest.json)")
}

func (s *Store) importLayout(ctx context.Context, gc *fileLock, name, dir string) (Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Image{}, fmt.Errorf("reading OCI layout: %w", err)
	}
	img, err := s.pickPlatform(idx, 0)
	if err != nil {
		return Image{}, err
	}
	rec, err := s.store(ctx, gc, name, "import", img, nil, nil)
	if err != nil {
		return Image{}, err
	}
	return s.image(rec), nil
}

// archiveKind tells an oci-archive ("oci": has oci-layout) from a docker
// save tar ("docker": has manifest.json and no oci-layout; Docker 25 and
// later write both, and the OCI layout is preferred as it keeps the
// registry's digests). It reads headers only.
func archiveKind(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	hasLayout, hasManifest := false, false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%s is not a tar archive: %w", p, err)
		}
		switch path.Clean(hdr.Name) {
		case "oci-layout":
			hasLayout = true
		case "manifest.json":
			hasManifest = true
		}
	}
	switch {
	case hasLayout:
		return "oci", nil
	case hasManifest:
		return "docker", nil
	}
	return "", nil
}

// extractLayout unpacks the regular files and directories of an
// oci-archive into dir, through an os.Root.
func extractLayout(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := cleanPath(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
				return err
			}
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
