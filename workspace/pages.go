package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
)

// A manifest is stored as pages: its entries, in path order, cut where a
// path's hash says so (about one path in pageSpread, at most maxPage per
// page), each page an object named by its hash like a file's. Cuts depend
// on the paths alone, so an edit, an added or a removed file changes one
// page: a sync of a 1 KiB edit uploads that file, one page and the small
// doc that lists the pages, whatever the number of files.
const (
	pageSpread = 256
	maxPage    = 2048
)

// page is one page of a doc: its object's hash and size.
type page struct {
	Hash string `json:"h"`
	Size int64  `json:"s"`
}

// cut says whether a page ends after path p.
func cut(p string) bool {
	h := sha256.Sum256([]byte(p))
	return h[0] < 256/pageSpread
}

// storePages stores entries as pages in the local store, pinned.
func (s *store) storePages(entries []Entry, pins *pinSet) ([]page, error) {
	pages := []page{}
	for start := 0; start < len(entries); {
		end := start
		for end < len(entries) && end-start < maxPage {
			end++
			if cut(entries[end-1].Path) {
				break
			}
		}
		b, err := json.Marshal(entries[start:end])
		if err != nil {
			return nil, err
		}
		hash, err := s.putLocalObject(b, pins)
		if err != nil {
			return nil, err
		}
		pages = append(pages, page{Hash: hash, Size: int64(len(b))})
		start = end
	}
	return pages, nil
}

// putLocalObject stores b in the local store under its hash, pinned.
func (s *store) putLocalObject(b []byte, pins *pinSet) (string, error) {
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])
	tmp, err := os.CreateTemp(s.tmpDir, "obj-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	_, err = s.pinObject(hash, tmp.Name(), pins)
	return hash, err
}

// entries reads d's pages (from the object store where the local store
// lacks them; each checked against its hash and size). A doc over the
// bounds (guard.go) is corrupt.
func (s *store) entries(ctx context.Context, d *doc) ([]Entry, error) {
	if len(d.Pages) > maxPages {
		return nil, corruptf("manifest has %d pages, more than %d", len(d.Pages), maxPages)
	}
	var all []Entry
	total := int64(0)
	for _, p := range d.Pages {
		if p.Size < 0 || p.Size > maxPageBytes || p.Size > maxManifestBytes-total {
			return nil, corruptf("manifest page %s: %d bytes, over the bounds", p.Hash, p.Size)
		}
		total += p.Size
		r, err := s.openObject(ctx, p.Hash, p.Size)
		if err != nil {
			return nil, fmt.Errorf("manifest page %s: %w", p.Hash, err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("manifest page %s: %w", p.Hash, err)
		}
		var es []Entry
		dec := json.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&es); err != nil {
			return nil, corruptf("manifest page %s: %v", p.Hash, err)
		}
		if len(es) > maxEntries-len(all) {
			return nil, corruptf("manifest has more than %d entries", maxEntries)
		}
		all = append(all, es...)
	}
	if !slices.IsSortedFunc(all, func(a, b Entry) int { return cmpString(a.Path, b.Path) }) {
		return nil, corruptf("manifest pages out of order")
	}
	return all, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
