package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"go.yaml.in/yaml/v3"
)

// serve's configuration file (--config PATH): YAML (JSON is YAML too),
// or TOML when its name ends in .toml, one key per flag, named as the
// flag without its dashes:
//
//	listen: 0.0.0.0:8443
//	max-sessions: 200
//	api-key: [team-a:KEY1, team-b:KEY2]
//	idle-timeout: 45m
//
// or, in TOML:
//
//	listen = "0.0.0.0:8443"
//	max-sessions = 200
//	api-key = ["team-a:KEY1", "team-b:KEY2"]
//	idle-timeout = "45m"
//
// A flag on the command line wins over its environment twin, which wins
// over the file, which wins over the default.

// Flags that are not settings: never read from the file, never printed.
var notSettings = map[string]bool{"config": true, "print-config": true}

// configEntry is one key of a configuration file: a flag's name and its
// value, or values for a repeatable flag.
type configEntry struct {
	name   string
	line   int // 0: not known
	values []string
	null   bool   // no value (YAML's null): the key is ignored
	bad    string // why the value is not one (a table, a list of lists...)
}

// applyConfigFile sets, from the YAML or TOML (.toml) file at path, every
// flag of fs not set yet (on the command line or from the environment).
func applyConfigFile(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var entries []configEntry
	if strings.EqualFold(filepath.Ext(path), ".toml") {
		entries, err = tomlEntries(path, b)
	} else {
		entries, err = yamlEntries(path, b)
	}
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	seen := map[string]bool{}
	for _, e := range entries {
		where := path
		if e.line > 0 {
			where = fmt.Sprintf("%s:%d", path, e.line)
		}
		at := fmt.Sprintf("--config %s: %s", where, e.name)
		if fs.Lookup(e.name) == nil || notSettings[e.name] {
			return fmt.Errorf("--config %s: unknown key %q (the keys are serve's flag names, without dashes)", where, e.name)
		}
		if seen[e.name] {
			return fmt.Errorf("%s: given twice", at)
		}
		seen[e.name] = true
		if e.bad != "" {
			return fmt.Errorf("%s: %s", at, e.bad)
		}
		if set[e.name] || e.null {
			continue // the command line or the environment wins
		}
		for _, val := range e.values {
			if err := fs.Set(e.name, val); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
	}
	return nil
}

// yamlEntries reads a YAML configuration file's keys, in order.
func yamlEntries(path string, b []byte) ([]configEntry, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("--config %s: want a mapping of flag names to values (listen: 127.0.0.1:8080)", path)
	}
	var entries []configEntry
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		e := configEntry{name: k.Value, line: k.Line}
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag == "!!null" {
				e.null = true
			} else {
				e.values = []string{v.Value}
			}
		case yaml.SequenceNode:
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					e.bad = "a list of values, each a scalar"
					break
				}
				e.values = append(e.values, item.Value)
			}
		default:
			e.bad = "want a value or a list of values"
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// tomlEntries reads a TOML configuration file's top-level keys, in order.
// TOML has no null and refuses a key given twice itself.
func tomlEntries(path string, b []byte) ([]configEntry, error) {
	var m map[string]any
	md, err := toml.Decode(string(b), &m)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("--config %s:%d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	var entries []configEntry
	for _, k := range md.Keys() {
		if len(k) != 1 {
			continue // inside a table: the table itself is refused
		}
		e := configEntry{name: k[0], line: tomlKeyLine(b, k[0])}
		switch v := m[k[0]].(type) {
		case []any:
			for _, item := range v {
				s, ok := tomlScalar(item)
				if !ok {
					e.bad = "a list of values, each a scalar"
					break
				}
				e.values = append(e.values, s)
			}
		default:
			s, ok := tomlScalar(v)
			if !ok {
				e.bad = "want a value or a list of values"
			}
			e.values = []string{s}
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// tomlScalar is a TOML value as the flag's text, if it is a scalar.
func tomlScalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case int64:
		return strconv.FormatInt(v, 10), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	case time.Time:
		return v.Format(time.RFC3339Nano), true
	}
	return "", false
}

// tomlKeyLine is the line of the first top-level assignment of key in a
// TOML file, bare or quoted, for error messages; 0 if not found.
func tomlKeyLine(b []byte, key string) int {
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			return 0 // a table starts: no top-level key after it
		}
		for _, k := range []string{key, `"` + key + `"`, "'" + key + "'"} {
			if rest, ok := strings.CutPrefix(line, k); ok && strings.HasPrefix(strings.TrimSpace(rest), "=") {
				return i + 1
			}
		}
	}
	return 0
}

// secretFlags hold secrets themselves (not the path of a file holding
// one): --print-config masks them.
var secretFlags = map[string]bool{"api-key": true, "metrics-token": true}

// printConfig writes fs's effective settings as a configuration file
// that --config reads back, secrets masked.
func printConfig(w io.Writer, fs *flag.FlagSet) error {
	doc := &yaml.Node{Kind: yaml.MappingNode}
	fs.VisitAll(func(f *flag.Flag) {
		if notSettings[f.Name] {
			return
		}
		var v *yaml.Node
		if l, ok := f.Value.(*listFlag); ok {
			v = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			for _, item := range *l {
				v.Content = append(v.Content, scalar(maskSecret(f.Name, item)))
			}
		} else {
			v = scalar(maskSecret(f.Name, f.Value.String()))
		}
		doc.Content = append(doc.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f.Name}, v)
	})
	var buf bytes.Buffer
	buf.WriteString("# sandgate serve: effective settings (flags, then SANDGATE_* twins, then --config, then defaults); secrets masked\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// scalar is v as YAML writes it plainly when it can: numbers, booleans
// and durations unquoted, other strings quoted only if they must be.
func scalar(v string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: v, Tag: "!!str"}
	if _, err := strconv.ParseFloat(v, 64); err == nil {
		n.Tag = "!!int"
		if strings.ContainsAny(v, ".eE") {
			n.Tag = "!!float"
		}
	} else if v == "true" || v == "false" {
		n.Tag = "!!bool"
	}
	return n
}

// maskSecret hides the secret part of a secret flag's value: an API key
// keeps its tenant.
func maskSecret(name, v string) string {
	if !secretFlags[name] || v == "" {
		return v
	}
	if tenant, _, ok := strings.Cut(v, ":"); ok && name == "api-key" {
		return tenant + ":********"
	}
	return "********"
}
