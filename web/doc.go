// Package web embeds the browser client and serves it from the gateway
// binary at /. The client (web/static) is plain HTML, CSS and ES modules
// with no build step: sign-in with a pasted or dev token, chat over the REST
// API and the realtime WebSocket (ticket flow, reconnect with backoff, REST
// reconciliation by seq, typing, presence, attachments), and the project
// Redis API console. docs/web-client.md describes it; its end-to-end tests
// drive it in headless Chromium (cmd/han-gateway/browser_test.go).
//
// The package has no state; Handler is safe for concurrent use.
package web
