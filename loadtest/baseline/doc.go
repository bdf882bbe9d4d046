// Package baseline is the reference target of the load tests: a minimal
// broadcast server on coder/websocket with no auth, presence or Redis. It
// speaks the gateway's realtime frames (docs/realtime-protocol.md: hello, subscribe /
// subscribed, event, ping / pong) on GET /v1/realtime with the han.v1
// subprotocol, and takes events to fan out on /publish (a WebSocket whose
// messages are "<channel>\n<event frame>", or a POST). Measured in the same
// run as the gateway it gives the library's ceiling on this machine, so the
// gateway's fan-out and per-connection memory are reported as ratios to it.
//
// Each connection has a reader (the handler goroutine) and a writer
// goroutine draining a bounded queue; a full queue drops the connection
// (slow consumer) and fan-out never blocks. GET /debug/memstats reports
// the process's heap, stacks, goroutines and RSS after a forced GC.
//
// A Server is safe for concurrent use; Close is idempotent.
package baseline
