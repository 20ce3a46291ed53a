// Package apispec embeds the OpenAPI document of the REST API, so that the
// binary serves the spec it was built with (GET /openapi.yaml,
// /openapi.json and /docs in package rest).
package apispec

import _ "embed"

// YAML is sandbox-api-spec.yaml as it was when the binary was built.
//
//go:embed sandbox-api-spec.yaml
var YAML []byte
