// Package docs carries the machine-readable API description of the
// service: openapi.yaml, kept here next to the prose documentation it
// belongs with, is embedded into the binary as it is, and OpenAPIJSON
// converts it to the JSON the API serves at GET /v1/openapi.json. The YAML
// file is the only copy, so what is served and what the tests validate
// against can never drift from what a reader of docs/ sees. The package
// keeps no state and is safe for concurrent use.
package docs
