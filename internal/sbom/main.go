// Command sbom writes a CycloneDX 1.5 SBOM (JSON) of a Go binary, from
// the module information the Go toolchain embeds in it (debug/buildinfo):
// the main module and every module linked in, each with its version,
// package URL and go.sum hash. `make dist` runs it on each binary it
// builds. It uses the standard library only, so it builds with no
// network.
//
// Usage: go run ./internal/sbom [-version V] BINARY > BINARY.cdx.json
//
// -version names the release (make's VERSION, stamped into the binary
// with -X, which the build information does not record).
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

type component struct {
	Type       string     `json:"type"`
	BOMRef     string     `json:"bom-ref"`
	Name       string     `json:"name"`
	Version    string     `json:"version,omitempty"`
	PURL       string     `json:"purl,omitempty"`
	Hashes     []hash     `json:"hashes,omitempty"`
	Properties []property `json:"properties,omitempty"`
}

type hash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type property struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type bom struct {
	BOMFormat    string `json:"bomFormat"`
	SpecVersion  string `json:"specVersion"`
	SerialNumber string `json:"serialNumber"`
	Version      int    `json:"version"`
	Metadata     struct {
		Timestamp  string     `json:"timestamp,omitempty"`
		Component  component  `json:"component"`
		Properties []property `json:"properties,omitempty"`
		Tools      any        `json:"tools"`
	} `json:"metadata"`
	Components []component `json:"components"`
}

func main() {
	version := flag.String("version", "", "the release's version (default: the main module's, from the binary)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: sbom [-version V] BINARY > SBOM.cdx.json")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *version, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func purl(path, version string) string { return "pkg:golang/" + path + "@" + version }

func run(path, version string, w io.Writer) error {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	var doc bom
	doc.BOMFormat, doc.SpecVersion, doc.Version = "CycloneDX", "1.5", 1
	// A serial number that is the same for the same binary (UUID form).
	s := hex.EncodeToString(sum[:16])
	doc.SerialNumber = fmt.Sprintf("urn:uuid:%s-%s-5%s-a%s-%s", s[:8], s[8:12], s[13:16], s[17:20], s[20:32])
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		if n, err := strconv.ParseInt(epoch, 10, 64); err == nil {
			doc.Metadata.Timestamp = time.Unix(n, 0).UTC().Format(time.RFC3339)
		}
	}
	if version == "" {
		version = info.Main.Version
	}
	doc.Metadata.Component = component{
		Type: "application", Name: filepath.Base(info.Path), Version: version,
		BOMRef: purl(info.Main.Path, version), PURL: purl(info.Main.Path, version),
		Hashes: []hash{{Alg: "SHA-256", Content: hex.EncodeToString(sum[:])}},
	}
	doc.Metadata.Properties = []property{{Name: "go:version", Value: info.GoVersion}}
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS", "GOARCH", "CGO_ENABLED", "vcs.revision", "vcs.time", "vcs.modified":
			doc.Metadata.Properties = append(doc.Metadata.Properties, property{Name: "go:" + s.Key, Value: s.Value})
		}
	}
	doc.Metadata.Tools = map[string]any{"components": []component{{Type: "application", BOMRef: "sandgate-sbom", Name: "sandgate internal/sbom"}}}
	doc.Components = []component{}
	for _, d := range info.Deps {
		c := component{Type: "library", Name: d.Path, Version: d.Version, PURL: purl(d.Path, d.Version), BOMRef: purl(d.Path, d.Version)}
		if d.Sum != "" {
			c.Properties = append(c.Properties, property{Name: "go:sum", Value: d.Sum})
		}
		if r := d.Replace; r != nil {
			c.Properties = append(c.Properties, property{Name: "go:replaced-by", Value: r.Path + "@" + r.Version})
			if r.Sum != "" {
				c.Properties = append(c.Properties, property{Name: "go:replacement-sum", Value: r.Sum})
			}
		}
		doc.Components = append(doc.Components, c)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
