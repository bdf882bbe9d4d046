// Package presence records who is online in Redis DB1 (han:rt:*): one
// connection HASH per socket and one ZSET of connections per user, refreshed
// by an atomic Lua heartbeat, removed by an idempotent disconnect, and swept
// by surviving instances when an instance dies.
package presence
