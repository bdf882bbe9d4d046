// Package resilience holds the Redis fault tests that need no running service:
// where Redis listens, presence after an empty restore, and the Pub/Sub link's
// reconnect backoff through a partition. The whole-service fault tests live in
// cmd/han-gateway; docs/testing.md maps every resilience requirement to its
// test.
package resilience
