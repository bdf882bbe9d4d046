// Package presence records who is online in Redis DB1 (han:rt:*): one
// connection HASH per socket and one ZSET of connections per user,
// refreshed by an atomic Lua heartbeat, removed by an idempotent
// disconnect (registration, in the same script, refuses a connection
// beyond the user's cap of live connections across all instances); an
// instance liveness marker and registry; and a sweeper with which
// surviving instances remove a dead instance's connections within
// liveness TTL + sweep interval. Online/offline transitions are reported
// once each (an online marker per user, offline debounced from the user's
// last disconnect; the debounced checks wait in one queue, those that fall
// due together share a pipeline, and a check that fails runs again; each
// pending check is listed in the instance's index, so a survivor that
// sweeps a dead instance runs the checks it had not run).
// Connects and disconnects that arrive together share pipelines; a
// draining instance removes its connections with DisconnectMany, one
// script per user and hundreds per round trip.
//
// Presence is safe for concurrent use. Its background work (liveness,
// periodic heartbeats, sweeper, debounced offline checks, transition
// callbacks) runs on goroutines that Close or Shutdown stop and wait for.
package presence
