// Package loadtest is the k6-style load generator behind cmd/han-loadtest:
// scenarios of virtual users that hold WebSocket connections and call the
// REST API against a loopback gateway, bounded in count and time.
package loadtest
