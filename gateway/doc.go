// Package gateway terminates browser WebSocket connections (subprotocol
// han.v1, github.com/coder/websocket) and wires the realtime side of an
// instance: Service holds the Hub, the Pub/Sub subscriber and publisher
// (package pubsub), presence (package presence), the outbox relay and the
// one-time tickets.
//
// GET /v1/realtime upgrades first (coder/websocket's own Origin check is
// off, because it accepts any same-host Origin and a missing one), then
// decides, in this order: the Origin, exactly against the allowed list (a
// ticket also requires one); the subprotocol; draining; the client
// address's budget of refused credentials, shared with the REST API
// (CredentialGate, credgate.go); the ticket or bearer token. Every refusal is a close frame after the upgrade (1008, 1001, 4001,
// 4003, 1013), because a browser cannot read the status of a failed upgrade.
// It then registers presence (refused with 1008 too_many_connections when the
// user already holds the per-user cap of connections, counted across all
// instances) and hands the connection to the Hub. An open connection that
// survivors swept while this instance was paused is closed the same way
// when, back, its presence refresh finds the user at the cap (overcap.go).
// Authentication and the presence registration, the handshake's Redis and
// PostgreSQL work, run under one of a bounded number of admission slots;
// handshakes beyond them wait in a bounded FIFO queue for a bounded time, and
// only beyond those bounds are refused with 1013 and a reconnect delay
// (admission.go).
//
// Expiry: every connection carries the deadline of its credential, the exp
// of its bearer token or of the token that issued its ticket (stored with
// the ticket), plus the token verifier's leeway, the same one REST applies.
// The hub's ping loop, the one timer of all connections, closes each
// connection past its deadline with 4001 token_expired (checked once a
// second). A refresh frame with a new token of the same user moves the
// deadline; it is verified on the reader, bounded by Config.AuthTimeout,
// and only while the budget of refused credentials of the client the
// handshake named holds a unit (otherwise the frame is answered with the
// error rate_limited and a retryMs); a token that fails verification
// spends one.
//
// Concurrency: per connection, one reader goroutine owns the connection. It
// only waits for the first byte of the client's next frame (and tears down
// at the end): each frame is read, decoded and answered on a pooled frame
// worker the reader waits for (up to 32 kept 2 s idle, frame_workers.go; a
// goroutine of its own when all are busy), so the reader stays on the
// runtime's smallest stack for the connection's life (conn_read.go). Only
// the reading side reads the socket: a close decided elsewhere wakes the
// reader (once a frame being read is in), which performs the close
// handshake, its reads bounded in time and bytes. A writer goroutine runs per
// burst, not for the connection's life: queueing a frame, a ping or a close
// starts one when none runs; it drains the bounded outbound queue in batches
// (each message framed by the gateway straight into the hijacked
// connection's cork buffer, one write deadline and one write per batch;
// coder/websocket writes only close frames and the pongs inside fragmented
// messages), writes the WebSocket ping the hub's ping loop marked due
// without waiting for the pong, hands the closes the hub decides on to the
// reader, and exits once nothing is left (after yielding once, so a fan-out
// burst keeps its writer), so an idle connection costs only its reader. A
// presence.changed frame does not start a writer: the ping loop's scan
// does, within Config.PresenceDelay, unless another frame comes first and
// takes it along, so a burst of transitions reaches a socket in few writes.
// A writer that fails leaves the connection marked as writing, so no other
// writer starts on it. Fan-out (Hub.Dispatch) never blocks: it appends the
// shared, pre-encoded event bytes to each queue under that connection's
// mutex, applying the backpressure policy (ephemeral frames dropped first,
// durable overflow replaced by one resync, persistent slowness closed with
// 4008). The hub's ping loop marks pings due, ends connections whose pong
// is late and closes expired connections under each connection's mu.
// Hub.mu is always taken before a connection's mu. Service, Hub and Tickets
// are safe for concurrent use.
//
// The protocol is documented in docs/realtime-protocol.md.
package gateway
