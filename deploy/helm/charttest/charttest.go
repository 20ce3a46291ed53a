// Package charttest lints and renders the sandgate Helm chart
// (deploy/helm/sandgate) with the Helm SDK (helm.sh/helm/v4), as `helm
// lint` and `helm template` do, in a module of its own so that the Helm
// and Kubernetes libraries stay out of the sandgate binary's module.
package charttest

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// ChartDir is the chart's directory, found from this file's.
func ChartDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "sandgate")
}

// Lint runs `helm lint` (strict: warnings count) on dir with vals, and
// returns every message it printed, and an error naming those that fail.
func Lint(dir string, vals map[string]any) ([]string, error) {
	l := action.NewLint()
	l.Strict = true
	l.Namespace = "sandgate"
	res := l.Run([]string{dir}, vals)
	var msgs []string
	for _, m := range res.Messages {
		msgs = append(msgs, m.Error())
	}
	if len(res.Errors) > 0 {
		return msgs, fmt.Errorf("helm lint: %w", errors.Join(res.Errors...))
	}
	return msgs, nil
}

// Object is one rendered manifest document.
type Object struct {
	Source string // template file
	Body   map[string]any
}

// Kind, Name and Namespace read the object's type and metadata.
func (o Object) Kind() string { s, _ := o.Body["kind"].(string); return s }
func (o Object) Name() string { return o.meta("name") }

// Namespace is the object's metadata.namespace ("" for cluster-scoped).
func (o Object) Namespace() string { return o.meta("namespace") }

func (o Object) meta(k string) string {
	m, _ := o.Body["metadata"].(map[string]any)
	s, _ := m[k].(string)
	return s
}

// Load reads the chart at dir.
func Load(dir string) (*chart.Chart, error) { return loader.Load(dir) }

// Render renders the chart at dir as `helm template --include-crds` does
// for an install of release into namespace, with vals over the chart's
// values. With cfg, templates' lookup reads that API server (as `helm
// install` does); without, lookup finds nothing. CRDs (crds/) come first,
// then the templates' objects sorted by file and name.
func Render(dir, release, namespace string, vals map[string]any, cfg *rest.Config) ([]Object, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	return renderChart(ch, release, namespace, vals, cfg)
}

func renderChart(ch *chart.Chart, release, namespace string, vals map[string]any, cfg *rest.Config) ([]Object, error) {
	caps := common.DefaultCapabilities
	if cfg != nil {
		// As `helm install` does: the server's version is the
		// templates' and Chart.yaml's kubeVersion constraint's.
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return nil, err
		}
		sv, err := dc.ServerVersion()
		if err != nil {
			return nil, fmt.Errorf("the API server's version: %w", err)
		}
		kv, err := common.ParseKubeVersion(sv.GitVersion)
		if err != nil {
			return nil, fmt.Errorf("the API server's version %q: %w", sv.GitVersion, err)
		}
		if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
			return nil, fmt.Errorf("chart requires kubeVersion %s, which the API server's %s is not", c, sv.GitVersion)
		}
		caps = caps.Copy()
		caps.KubeVersion = *kv
	}
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	var files map[string]string
	if cfg != nil {
		files, err = engine.RenderWithClient(ch, rv, cfg)
	} else {
		files, err = engine.Render(ch, rv)
	}
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, crd := range ch.CRDObjects() {
		objs, err := split(crd.Filename, string(crd.File.Data))
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") && !strings.HasSuffix(n, ".yml") {
			continue // NOTES.txt, helpers
		}
		objs, err := split(n, files[n])
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// split parses the YAML documents of one file, leaving out empty ones.
func split(source, text string) ([]Object, error) {
	var out []Object
	for _, doc := range strings.Split("\n"+text, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var body map[string]any
		if err := yaml.Unmarshal([]byte(doc), &body); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if len(body) == 0 {
			continue
		}
		out = append(out, Object{Source: source, Body: body})
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// yamlOf is body as a YAML document.
func yamlOf(body map[string]any) (string, error) {
	b, err := yaml.Marshal(body)
	return string(b), err
}
