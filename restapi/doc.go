// Package restapi is the HTTP API of the gateway on gorilla/mux: health,
// readiness and metrics, the public config, the chat REST API under /v1
// (dialogs, messages with per-dialog seq, reconciliation history) and the
// middleware every route shares (request id, access log without tokens,
// bodies or raw IPs, authentication, body limits enforced while reading,
// rate-limit and idempotency seams).
//
// Every error body is exactly {"error":"<stable_code>"}, written by one
// function (writeError; handlers return errors that Server.fail renders);
// success bodies are bare DTOs with epoch-millisecond
// timestamps. A Server is safe for concurrent use.
package restapi
