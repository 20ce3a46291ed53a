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

// ImageAliases is what an Images may also implement (found by type
// assertion): the names a create may ask for that stand for another image
// (serve's --image-alias).
type ImageAliases interface {
	ImageAliases() []ImageAlias
}

// ImageAlias is a name that stands for another image.
type ImageAlias struct {
	Name  string `json:"name"`  // as the operator gave it
	Image string `json:"image"` // the image it stands for (normalised), or "default"
}

// ImageInfo is one image present on the gateway.
type ImageInfo struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"sizeBytes"`
	PulledAt  time.Time `json:"pulledAt"`
}

type imageListJSON struct {
	Images  []ImageInfo  `json:"images"`
	Allow   []string     `json:"allow"`
	Aliases []ImageAlias `json:"aliases"`
}

func (a *api) listImages(w http.ResponseWriter, r *http.Request) {
	out := imageListJSON{Images: []ImageInfo{}, Allow: []string{}, Aliases: []ImageAlias{}}
	if a.cfg.Images != nil {
		imgs, allow, err := a.cfg.Images.ListImages(r.Context())
		if err != nil {
			a.cfg.Log.ErrorContext(r.Context(), "images_list_failed", "err", err)
			WriteError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		out.Images = append(out.Images, imgs...)
		out.Allow = append(out.Allow, allow...)
		if ia, ok := a.cfg.Images.(ImageAliases); ok {
			out.Aliases = append(out.Aliases, ia.ImageAliases()...)
		}
	}
	WriteJSON(w, http.StatusOK, out)
}
