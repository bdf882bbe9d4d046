// Package legacystub is the legacy DB2 safety stub v1 (docs/legacy-stub.md):
// a stand-in for the Safety service until cutover.
// While it is enabled, every message send records a safety task — a
// stub_tasks row in the send transaction and, right after the commit, a
// HASH han:stub:task:{<message_id>} in Redis DB2 written as ACL user
// legacy_stub — and GET /v1/messages/{id}/safety polls it; a random verdict
// appears after a few polls. A Recoverer decides tasks nobody finished
// polling within the poll budget, under the Redis lock
// han:coord:lock:safety-recovery:{<task_id>} and a PostgreSQL lease, which
// is the real guard.
//
// The task TTL in DB2 must cover the poll budget and the recovery budget
// (Config.Validate): the service refuses to start otherwise.
//
// Stub and Recoverer are safe for concurrent use. Recoverer.Start runs one
// goroutine until Close.
package legacystub
