// Package loadtest is the k6-style load generator behind cmd/han-loadtest:
// scenarios of virtual users that hold WebSocket connections and call the
// REST API of a loopback target, bounded in count and time.
//
// The pieces: executors (ConstantVUs, RampingVUs, ConstantArrivalRate, the
// last on a fixed schedule so latency is measured from each iteration's
// planned start, free of coordinated omission); a Registry of counters,
// gauges, rates and trends (an HDR-style log-bucket Histogram with 0.39 %
// worst-case percentile error); thresholds parsed from expressions like
// delivery_p99<150ms; the end-of-test Summary (k6-like text and JSON); a
// WebSocket client (WSDialer/WSConn) that speaks the gateway's realtime
// frames, or Centrifugo's JSON protocol for comparison runs, and accounts
// for deliveries (latency from schedule, loss, duplicates); the message
// Centrifugo's Redis engine publishes (AppendCentrifugoPublication), so a
// Centrifugo can be fed by raw PUBLISH like the gateway; an API client for the REST endpoints; and the loopback-only
// networking (CheckLoopbackURL, a pool of 127.0.0.x source addresses,
// RaiseFileLimit). Run ties them together for one Scenario.
//
// Concurrency: Registry and its metrics, Histogram, Deliveries, WSDialer,
// API and SourceAddrs are safe for concurrent use. A WSConn is read by its
// own goroutine; Subscribe, Send and Close may be called from others. A
// Scenario runs once per Run.
package loadtest
