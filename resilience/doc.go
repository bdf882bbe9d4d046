// Package resilience holds the fault tests of seed module-04 §12 that need
// no running service: where Redis listens, presence after an empty
// restore, and the Pub/Sub link's reconnect backoff through a partition.
// The whole-service fault tests live in cmd/han-gateway; docs/testing.md
// maps every §12 line to its test.
package resilience
