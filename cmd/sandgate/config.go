package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// serve's configuration file (--config PATH): YAML (JSON is YAML too),
// one key per flag, named as the flag without its dashes:
//
//	listen: 0.0.0.0:8443
//	max-sessions: 200
//	api-key: [team-a:KEY1, team-b:KEY2]
//	idle-timeout: 45m
//
// A flag on the command line wins over its environment twin, which wins
// over the file, which wins over the default.

// Flags that are not settings: never read from the file, never printed.
var notSettings = map[string]bool{"config": true, "print-config": true}

// applyConfigFile sets, from the YAML file at path, every flag of fs not
// set yet (on the command line or from the environment).
func applyConfigFile(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return fmt.Errorf("--config %s: want a mapping of flag names to values (listen: 127.0.0.1:8080)", path)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		name := k.Value
		at := fmt.Sprintf("--config %s:%d: %s", path, k.Line, name)
		if fs.Lookup(name) == nil || notSettings[name] {
			return fmt.Errorf("--config %s:%d: unknown key %q (the keys are serve's flag names, without dashes)", path, k.Line, name)
		}
		if seen[name] {
			return fmt.Errorf("%s: given twice", at)
		}
		seen[name] = true
		if set[name] {
			continue // the command line or the environment wins
		}
		var values []string
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag == "!!null" {
				continue
			}
			values = []string{v.Value}
		case yaml.SequenceNode:
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return fmt.Errorf("%s: a list of values, each a scalar", at)
				}
				values = append(values, item.Value)
			}
		default:
			return fmt.Errorf("%s: want a value or a list of values", at)
		}
		for _, val := range values {
			if err := fs.Set(name, val); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
	}
	return nil
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
