//go:build !linux

package sftpd

import "os"

// splicer is Linux's: elsewhere READs are always read(2).
type splicer struct{ max int }

func newSplicer(*os.File) *splicer { return nil }

func (*splicer) fill(*os.File, int64, int) (int, error) { return 0, errNoSplice }
func (*splicer) send(int) error                         { return errNoSplice }
func (*splicer) close()                                 {}
func (*splicer) wrote(int)                              {}
func (*splicer) settle() error                          { return nil }
