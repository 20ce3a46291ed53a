package rest

import (
	"strings"
	"testing"
)

// Raw HTML in the spec's Markdown is omitted from /docs, and links with
// script schemes are dropped: the page renders text, never markup from the
// document.
func TestRenderMarkdownOmitsRawHTML(t *testing.T) {
	out, err := renderMarkdown("Hello <script>alert(1)</script> `code`\n\n<div onclick=x>block</div>\n\n[x](javascript:alert(1))\n")
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, bad := range []string{"<script", "<div", "onclick", "javascript:"} {
		if strings.Contains(s, bad) {
			t.Errorf("rendered %q contains %q", s, bad)
		}
	}
	if !strings.Contains(s, "<code>code</code>") {
		t.Errorf("rendered %q: Markdown not rendered", s)
	}
}
