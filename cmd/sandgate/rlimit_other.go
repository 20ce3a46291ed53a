//go:build !unix

package main

import "log/slog"

func raiseNofile(*slog.Logger) {}
