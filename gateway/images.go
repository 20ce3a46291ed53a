package gateway

import (
	"context"

	"github.com/sandgate/sandgate/sandbox"
)

// ImageSource resolves the images a create may ask for beyond the default
// root, and keeps those that sandboxes use. cmd/sandgate implements it over
// the image store (package images); Manager calls it.
type ImageSource interface {
	// Check reports whether name may be asked for (it is present, or may
	// be pulled), without pulling: an *Error (unknown_image) when not.
	Check(name string) error
	// Resolve returns the image called name, pulled first when it is
	// missing and may be pulled. Its errors are *Error values
	// (unknown_image, image_pull_failed). ctx carries the principal of
	// the create (PrincipalFrom).
	Resolve(ctx context.Context, name string) (*sandbox.Image, error)
	// Hold records that session id's sandbox uses img, so
	// that it is not removed; it survives a restart of the gateway.
	Hold(id string, img *sandbox.Image) error
	// HoldWarm is Hold for warm sandbox id, which no session has claimed
	// yet: an operator's image removal does not wait for it (the image's
	// layers stay while it lives). Hold of the same id, at the claim,
	// makes it a session's hold.
	HoldWarm(id string, img *sandbox.Image) error
	// Release forgets session id's hold.
	Release(id string)
}
