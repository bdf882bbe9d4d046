// Package web embeds the browser client and serves it from the gateway
// binary at /. The client (web/static) is plain HTML, CSS and ES modules
// with no build step: sign-in with a pasted or dev token, chat over the REST
// API and the realtime WebSocket (typing, presence, attachments), and the
// project Redis API console. Its realtime connection, message sending and
// history paging are the JavaScript SDK's (web/sdk), whose runtime modules
// are embedded too and served under /sdk/. docs/web-client.md describes it; its end-to-end tests
// drive it in headless Chromium (cmd/han-gateway/browser_test.go against the real service,
// web/browser_test.go against a server that answers what the real one never would).
//
// The package has no state; Handler is safe for concurrent use.
package web
