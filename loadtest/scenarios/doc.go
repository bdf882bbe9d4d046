// Package scenarios holds the load tests han-loadtest runs: broadcast and
// idle-connections (against the gateway, the baseline server or a
// Centrifugo v6 to compare with), and
// chat-fanout, connect-storm, rate-limit and project-queue against the
// gateway, and send-sql: the send path's raw SQL baseline, the store's
// own send function on a pgx pool like the gateway's (no HTTP, no Redis),
// in chat-fanout's shape and schedule. Each scenario is a loadtest.Scenario with its own flags; New
// returns a fresh one by name.
//
// A scenario value is used for one run and is not safe for concurrent use.
package scenarios
