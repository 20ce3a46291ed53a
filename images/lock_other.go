//go:build !unix

package images

import "errors"

type fileLock struct{}

func lockFile(path string, exclusive, wait bool) (*fileLock, error) {
	return nil, errors.New("images: file locks need a Unix system")
}

func (l *fileLock) unlock() {}
