// Package ratelimit decides whether a request may proceed: Redis Lua
// scripts in DB0 (sliding log, fixed window, token bucket) evaluate every
// limit family of one request (user, ip, dialog, service) together, a denial
// writes nothing, and Redis TIME is the clock (docs/ratelimit.md). When Redis fails,
// a route's policy either fails closed (the caller answers 503) or falls back
// to a bounded in-process limiter with a fraction of the normal quota
// (docs/degraded-mode.md); a caller that still serves a fail-closed
// request from elsewhere bounds it with that limiter too (DecideLocal). A
// family's admission for a request that never reached what the family
// protects is given back with Refund (a send refused as not a member of the
// dialog must not spend the dialog's limit).
//
// FailBudget is separate from the Redis limits: an in-process token bucket
// per client address of the credentials refused on the REST API, asked
// before a token is verified (docs/ratelimit.md, "Refused credentials").
//
// Policies come from a PolicyProvider (static configuration by default);
// route labels are a bounded allow-list of router templates, anything else is
// "other". Key names are built in keys.go and nowhere else.
//
// A Limiter is safe for concurrent use. It never blocks a decision past its
// Redis timeout budget, and after a Redis outage it probes with one request at
// a time until Redis answers again.
package ratelimit
