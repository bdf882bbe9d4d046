// Package gateway terminates browser WebSocket connections (subprotocol
// han.v1, github.com/coder/websocket) and wires the realtime side of an
// instance: Service holds the Hub, the Pub/Sub subscriber and publisher
// (package pubsub), presence (package presence), the outbox relay and the
// one-time tickets.
//
// GET /v1/realtime checks the Origin exactly against the allowed list
// before the upgrade, authenticates by ticket or bearer token after it (so
// refusals are close frames a browser can read), registers presence
// (refused with 1008 too_many_connections when the user already holds the
// per-user cap of connections) and hands the connection to the Hub.
//
// Concurrency: per connection, one reader goroutine owns the connection
// (reads, handles client frames in order, tears down); it starts exactly
// one writer goroutine, which drains the bounded outbound queue in batches
// (corked into one write), sends the WebSocket pings the hub asks for and
// performs the closes the hub decides on. Fan-out (Hub.Dispatch) never
// blocks: it appends the shared, pre-encoded event bytes to each queue
// under that connection's mutex, applying the backpressure policy
// (ephemeral frames dropped first, durable overflow replaced by one
// resync, persistent slowness closed with 4008). Hub.mu is always taken
// before a connection's mu. Service, Hub and Tickets are safe for
// concurrent use.
//
// The protocol is documented in docs/realtime-protocol.md.
package gateway
