//go:build !unix

package main

import (
	"context"
	"errors"
	"os"

	"github.com/sandgate/sandgate/tunnel"
)

func proxyFdpass(context.Context, *tunnel.Dialer, string, *os.File) error {
	return errors.New("--fdpass needs a Unix system")
}
