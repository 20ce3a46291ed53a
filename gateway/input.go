package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// Bounds on a session's metadata, so that every client can parse what a
// tenant stored (some JSON parsers stop at a nesting depth of 20 or 100).
const (
	// MaxMetadataDepth is how deep metadata may nest: the metadata object
	// itself is level 1, and each object or array inside it adds one.
	MaxMetadataDepth = 8
	// MaxMetadataKeys bounds the object keys of metadata at every level together.
	MaxMetadataKeys = 64
	// MaxMetadataBytes bounds metadata's compact JSON encoding.
	MaxMetadataBytes = 16 << 10
)

// checkMetadata enforces the metadata bounds on md, as decoded from JSON
// (maps, slices, strings, float64s, bools and nils).
func checkMetadata(md map[string]any) error {
	depth, keys := 0, 0
	var walk func(v any, level int)
	walk = func(v any, level int) {
		switch v := v.(type) {
		case map[string]any:
			depth = max(depth, level)
			keys += len(v)
			for _, e := range v {
				walk(e, level+1)
			}
		case []any:
			depth = max(depth, level)
			for _, e := range v {
				walk(e, level+1)
			}
		}
	}
	walk(md, 1)
	if depth > MaxMetadataDepth {
		return Invalid("metadata_too_deep", fmt.Sprintf("metadata nests %d levels deep; at most %d are allowed", depth, MaxMetadataDepth))
	}
	if keys > MaxMetadataKeys {
		return Invalid("metadata_too_many_keys", fmt.Sprintf("metadata has %d keys at all levels together; at most %d are allowed", keys, MaxMetadataKeys))
	}
	data, err := json.Marshal(md)
	if err != nil {
		return Invalid("invalid_field", "metadata must be a JSON object")
	}
	if len(data) > MaxMetadataBytes {
		return Invalid("metadata_too_large", fmt.Sprintf("metadata is %d bytes as compact JSON; at most %d are allowed", len(data), MaxMetadataBytes))
	}
	return nil
}

// checkSSHPublicKey returns key, trimmed, if it is one authorized_keys line
// without options. Options (command="...", from="...", ...) are refused
// rather than stored unenforced.
func checkSSHPublicKey(key string) (string, error) {
	key = strings.TrimSpace(key)
	if key == "" {
		return "", nil
	}
	if strings.ContainsAny(key, "\r\n") {
		return "", Invalid("invalid_ssh_public_key", "sshPublicKey must be a single authorized_keys line")
	}
	_, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(key))
	if err != nil {
		return "", Invalid("invalid_ssh_public_key", "sshPublicKey is not an authorized_keys line")
	}
	if len(options) > 0 {
		names := make([]string, 0, len(options))
		for _, o := range options[:min(len(options), 8)] {
			name, _, _ := strings.Cut(o, "=")
			if len(name) > 32 {
				name = name[:32] + "..."
			}
			names = append(names, strconv.Quote(name))
		}
		if len(options) > 8 {
			names = append(names, "...")
		}
		return "", Invalid("invalid_ssh_public_key", fmt.Sprintf(
			"sshPublicKey has authorized_keys options (%s), which sandgate does not enforce; give the key without options",
			strings.Join(names, ", ")))
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return "", Invalid("invalid_ssh_public_key", "sshPublicKey must hold exactly one key")
	}
	return key, nil
}
