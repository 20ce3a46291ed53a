package rest

import (
	"context"
	"net/http"
	"time"
)

// Images lists the images sessions may use beyond the default root.
// cmd/sandgate implements it over the image store.
type Images interface {
	// ListImages returns the images present and the patterns of those a
	// create may pull on demand.
	ListImages(ctx context.Context) ([]ImageInfo, []string, error)
}

// ImageInfo is one image present on the gateway.
type ImageInfo struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"sizeBytes"`
	PulledAt  time.Time `json:"pulledAt"`
}

type imageListJSON struct {
	Images []ImageInfo `json:"images"`
	Allow  []string    `json:"allow"`
}

func (a *api) listImages(w http.ResponseWriter, r *http.Request) {
	out := imageListJSON{Images: []ImageInfo{}, Allow: []string{}}
	if a.cfg.Images != nil {
		imgs, allow, err := a.cfg.Images.ListImages(r.Context())
		if err != nil {
			a.cfg.Log.ErrorContext(r.Context(), "images_list_failed", "err", err)
			WriteError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		out.Images = append(out.Images, imgs...)
		out.Allow = append(out.Allow, allow...)
	}
	WriteJSON(w, http.StatusOK, out)
}
