// Package soak is the repeatable fault soak behind `han-loadtest run soak`:
// it starts a local stack of its own (two gateway instances, a private
// redis-server with the rendered ACL and AOF reached through a fault proxy,
// a private PostgreSQL), drives real traffic against it (chat senders with
// Idempotency-Keys and retries, WebSocket clients that reconcile like the
// web client, project-queue producers and consumers), injects faults on a
// schedule derived from a seed, and checks the invariants the service
// promises while it runs and at the end (Checker).
//
// Concurrency: Stack, Checker and the traffic's ledgers are safe for
// concurrent use. Run drives one soak at a time.
package soak
