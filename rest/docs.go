package rest

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/extension"

	apispec "github.com/sandgate/sandgate/api-spec"
)

// apiDocs serves the embedded OpenAPI document as YAML and JSON, a
// readable reference rendered from it on the server (no scripts, no
// assets from elsewhere; the spec's Markdown rendered as HTML, its raw
// HTML omitted), and a landing page at / linking them. The JSON and HTML
// are built once, on first use.
type apiDocs struct {
	once               sync.Once
	json, web, landing []byte
	err                error
}

// docsCSS is the one style sheet of both pages, inline; the pages' CSP
// allows exactly it (by hash) and nothing else: no scripts, images,
// fonts, frames or connections.
const docsCSS = `
body{font:15px/1.5 system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;color:#222}
pre,code{font:13px/1.4 ui-monospace,monospace}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5rem;border-radius:4px}
.op{border:1px solid #ddd;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}
.m{display:inline-block;min-width:4.5rem;font-weight:bold}
.get{color:#0a6}.post{color:#06c}.put{color:#a60}.patch{color:#a0a}.delete{color:#c22}
table{border-collapse:collapse;width:100%;margin:.5rem 0}td,th{border-bottom:1px solid #eee;text-align:left;padding:.2rem .5rem;vertical-align:top}
td p{margin:0}
nav a{display:block;font:13px ui-monospace,monospace}
`

// docsCSP is the Content-Security-Policy of the HTML pages.
var docsCSP = func() string {
	sum := sha256.Sum256([]byte(docsCSS))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// markdown renders the spec's descriptions (CommonMark with GitHub's
// tables). Raw HTML in them is omitted, not passed through (goldmark's
// default without html.WithUnsafe), and unsafe link schemes are dropped.
var markdown = goldmark.New(goldmark.WithExtensions(extension.Table, extension.Strikethrough))

func renderMarkdown(src string) (template.HTML, error) {
	if strings.TrimSpace(src) == "" {
		return "", nil
	}
	var buf bytes.Buffer
	if err := markdown.Convert([]byte(src), &buf); err != nil {
		return "", fmt.Errorf("render markdown: %w", err)
	}
	return template.HTML(buf.String()), nil // #nosec G203 -- goldmark's safe mode: raw HTML omitted
}

func (d *apiDocs) build() {
	d.once.Do(func() {
		doc, err := openapi3.NewLoader().LoadFromData(apispec.YAML)
		if err != nil {
			d.err = fmt.Errorf("load the embedded spec: %w", err)
			return
		}
		if d.json, err = json.MarshalIndent(doc, "", "  "); err != nil {
			d.err = fmt.Errorf("encode the spec: %w", err)
			return
		}
		var buf bytes.Buffer
		if err := docsPage.Execute(&buf, newDocsView(doc)); err != nil {
			d.err = fmt.Errorf("render the reference: %w", err)
			return
		}
		d.web = buf.Bytes()
		buf = bytes.Buffer{}
		if err := landingPage.Execute(&buf, newDocsView(doc)); err != nil {
			d.err = fmt.Errorf("render the landing page: %w", err)
			return
		}
		d.landing = buf.Bytes()
	})
}

func (d *apiDocs) serve(w http.ResponseWriter, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

func (d *apiDocs) yaml(w http.ResponseWriter, r *http.Request) {
	d.serve(w, "application/yaml", apispec.YAML)
}

func (d *apiDocs) jsonSpec(w http.ResponseWriter, r *http.Request) {
	if d.build(); d.err != nil {
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	d.serve(w, "application/json", d.json)
}

func (d *apiDocs) page(w http.ResponseWriter, r *http.Request) {
	if d.build(); d.err != nil {
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	w.Header().Set("Content-Security-Policy", docsCSP)
	d.serve(w, "text/html; charset=utf-8", d.web)
}

// home is the landing page at /: what this is, and links to the reference
// and the spec. Any other path outside the API still answers the JSON 404.
func (d *apiDocs) home(w http.ResponseWriter, r *http.Request) {
	if d.build(); d.err != nil {
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	w.Header().Set("Content-Security-Policy", docsCSP)
	d.serve(w, "text/html; charset=utf-8", d.landing)
}

// docsView is what the reference page shows.
type docsView struct {
	Title, Version, Description string
	Operations                  []docsOperation
	Schemas                     []docsSchema
}

type docsOperation struct {
	Method, Path, ID, Summary, Description string
	Public                                 bool
	Params                                 []docsField
	Body                                   string
	Responses                              []docsField
}

type docsField struct {
	Name, Type, Description string
	Required                bool
}

type docsSchema struct {
	Name, Description string
	Fields            []docsField
}

func newDocsView(doc *openapi3.T) docsView {
	v := docsView{Title: doc.Info.Title, Version: doc.Info.Version, Description: doc.Info.Description}
	paths := doc.Paths.InMatchingOrder()
	slices.Sort(paths)
	for _, p := range paths {
		item := doc.Paths.Value(p)
		for _, method := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			op := item.GetOperation(method)
			if op == nil {
				continue
			}
			o := docsOperation{Method: method, Path: p, ID: op.OperationID, Summary: op.Summary, Description: op.Description,
				Public: op.Security != nil && len(*op.Security) == 0}
			for _, pr := range append(item.Parameters, op.Parameters...) {
				if pr.Value == nil {
					continue
				}
				o.Params = append(o.Params, docsField{Name: pr.Value.Name + " (" + pr.Value.In + ")",
					Type: schemaType(pr.Value.Schema), Description: pr.Value.Description, Required: pr.Value.Required})
			}
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				for ct, mt := range op.RequestBody.Value.Content {
					o.Body = ct + ": " + schemaType(mt.Schema)
				}
			}
			codes := op.Responses.Map()
			keys := make([]string, 0, len(codes))
			for k := range codes {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				r := codes[k]
				desc := ""
				if r.Value != nil && r.Value.Description != nil {
					desc = *r.Value.Description
				}
				o.Responses = append(o.Responses, docsField{Name: k, Description: desc, Type: refName(r.Ref)})
			}
			v.Operations = append(v.Operations, o)
		}
	}
	names := make([]string, 0, len(doc.Components.Schemas))
	for n := range doc.Components.Schemas {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s := doc.Components.Schemas[n].Value
		ds := docsSchema{Name: n, Description: s.Description}
		props := make([]string, 0, len(s.Properties))
		for p := range s.Properties {
			props = append(props, p)
		}
		slices.Sort(props)
		for _, p := range props {
			ps := s.Properties[p]
			desc := ""
			if ps.Value != nil {
				desc = ps.Value.Description
			}
			ds.Fields = append(ds.Fields, docsField{Name: p, Type: schemaType(ps), Description: desc, Required: slices.Contains(s.Required, p)})
		}
		v.Schemas = append(v.Schemas, ds)
	}
	return v
}

// schemaType names a schema for people: its reference, or its type.
func schemaType(s *openapi3.SchemaRef) string {
	if s == nil {
		return ""
	}
	if s.Ref != "" {
		return refName(s.Ref)
	}
	if s.Value == nil || s.Value.Type == nil {
		return "any"
	}
	t := strings.Join(s.Value.Type.Slice(), "|")
	if t == "array" && s.Value.Items != nil {
		return "array of " + schemaType(s.Value.Items)
	}
	return t
}

func refName(ref string) string { return ref[strings.LastIndexByte(ref, '/')+1:] }

var docsPage = template.Must(template.New("docs").Funcs(template.FuncMap{"lower": strings.ToLower, "md": renderMarkdown, "css": func() template.CSS { return docsCSS }}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{{css}}</style></head><body>
<h1>{{.Title}} <small>{{.Version}}</small></h1>
<p><a href="./">Home</a>. The machine-readable spec: <a href="openapi.yaml">openapi.yaml</a>, <a href="openapi.json">openapi.json</a>.</p>
<div class="md">{{md .Description}}</div>
<h2>Operations</h2>
<nav>{{range .Operations}}<a href="#{{.ID}}">{{.Method}} {{.Path}}</a>{{end}}</nav>
{{range .Operations}}<div class="op" id="{{.ID}}">
<h3><span class="m {{lower .Method}}">{{.Method}}</span> <code>{{.Path}}</code></h3>
<p><b>{{.Summary}}</b>{{if .Public}} (no token){{end}}</p><div class="md">{{md .Description}}</div>
{{if .Params}}<table><tr><th>parameter</th><th>type</th><th>required</th><th></th></tr>{{range .Params}}<tr><td><code>{{.Name}}</code></td><td>{{.Type}}</td><td>{{if .Required}}yes{{end}}</td><td><div class="md">{{md .Description}}</div></td></tr>{{end}}</table>{{end}}
{{if .Body}}<p>Request body: <code>{{.Body}}</code></p>{{end}}
<table><tr><th>status</th><th></th></tr>{{range .Responses}}<tr><td><code>{{.Name}}</code></td><td>{{if .Type}}<a href="#{{.Type}}">{{.Type}}</a>: {{end}}<div class="md">{{md .Description}}</div></td></tr>{{end}}</table>
</div>{{end}}
<h2>Schemas</h2>
{{range .Schemas}}<div class="op" id="{{.Name}}"><h3><code>{{.Name}}</code></h3><div class="md">{{md .Description}}</div>
{{if .Fields}}<table><tr><th>field</th><th>type</th><th>required</th><th></th></tr>{{range .Fields}}<tr><td><code>{{.Name}}</code></td><td>{{.Type}}</td><td>{{if .Required}}yes{{end}}</td><td><div class="md">{{md .Description}}</div></td></tr>{{end}}</table>{{end}}
</div>{{end}}
</body></html>
`))

var landingPage = template.Must(template.New("landing").Funcs(template.FuncMap{"css": func() template.CSS { return docsCSS }}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandgate</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{{css}}</style></head><body>
<h1>sandgate</h1>
<p>This is a sandgate gateway: isolated Linux sandboxes for AI agents, reachable over SSH and SFTP through this HTTPS port, and over a REST API ({{.Title}} {{.Version}}).</p>
<ul>
<li><a href="ui/">Console</a> (<code>/ui/</code>): sign in with an API key to watch and drive your sessions in the browser</li>
<li><a href="docs">API reference</a> (<code>/docs</code>)</li>
<li><a href="openapi.json">openapi.json</a> and <a href="openapi.yaml">openapi.yaml</a>: the OpenAPI document this gateway was built with</li>
<li><a href="healthz">healthz</a>: liveness</li>
</ul>
<p>From a shell, with the gateway's URL and an API key:</p>
<pre>export SANDBOX_API_URL=&lt;this address&gt; SANDBOX_API_TOKEN=&lt;your key&gt;
sandgate session create --name dev
sandgate ssh dev</pre>
</body></html>
`))
