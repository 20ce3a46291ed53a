//go:build !linux

package linuxns

import (
	"context"
	"errors"

	"github.com/sandgate/sandgate/sandbox"
)

// Driver is the linuxns driver, which this platform does not have.
type Driver struct{}

// New reports that the linuxns driver needs Linux.
func New(sandbox.Config) (*Driver, error) {
	return nil, errors.New("the linux driver needs Linux")
}

// Name implements sandbox.Driver.
func (*Driver) Name() string { return "linux" }

// Create implements sandbox.Driver.
func (*Driver) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return nil, errors.New("the linux driver needs Linux")
}
