// Package restapi is the HTTP API of the gateway on gorilla/mux: health,
// readiness and metrics, the public config, the chat REST API under /v1
// (dialogs, messages with per-dialog seq, reconciliation history,
// attachments, realtime tickets, presence, the internal inbox, the legacy
// safety poll; it mounts the project Redis API) and the
// middleware every route shares (body read and response write deadlines,
// request id, access log without tokens, bodies or raw IPs, authentication
// with each client address's budget of refused credentials (authfail.go),
// body limits enforced while reading, rate-limit and idempotency seams).
// The client address and scheme come from one place (clientip.go), which
// believes forwarding headers only from configured trusted proxies.
//
// Every error body is exactly {"error":"<stable_code>"}, written by one
// function (writeError; handlers return errors that Server.fail renders);
// success bodies are bare DTOs with epoch-millisecond timestamps. Every path
// under the service's own roots (/v1, /projects, /debug, /metrics, /healthz,
// /readyz) answers an unknown path with 404 not_found and another method with
// 405 method_not_allowed plus Allow; the web client (MountWeb) serves only
// paths outside them. A Server is safe for concurrent use.
package restapi
