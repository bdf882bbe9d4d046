// Package gateway terminates browser WebSocket connections (subprotocol
// han.v1): authentication by one-time ticket or bearer token, per-connection
// reader and writer goroutines with a bounded outbound queue, subscriptions
// to dialogs and the fan-out of realtime events from package pubsub.
//
// The realtime protocol is documented in docs/realtime-protocol.md.
package gateway
