// Package thirdparty holds nothing to import: its test checks that the
// patched copies of dependencies under this directory are their upstream
// versions plus the recorded patches, and nothing else (see README.md).
package thirdparty
