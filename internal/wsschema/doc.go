// Package wsschema checks realtime WebSocket frames against the JSON Schemas
// that describe them (docs/schemas/ws, referenced from docs/asyncapi.yaml),
// so the tests that exchange frames with a real gateway also keep the
// published protocol description true.
//
// A Validator is immutable after Load and safe for concurrent use.
package wsschema
