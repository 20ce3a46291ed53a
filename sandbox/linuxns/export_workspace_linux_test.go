//go:build linux

package linuxns

// MaxSizedTemplates is how many templates of non-default workspace sizes
// a driver keeps.
const MaxSizedTemplates = maxSizedTemplates
