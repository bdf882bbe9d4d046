// Package apicheck validates, in tests, every HTTP answer of the service
// against its OpenAPI description (docs/openapi.yaml, package docs): Install
// wraps http.DefaultTransport so every client the tests use without a
// transport of their own is checked, and Err reports what failed for
// TestMain to fail the run. Only answers to a route the description names
// are checked; an undocumented status on such a route is a failure. Test
// code only; safe for concurrent use.
package apicheck
