// Package apierr is the API error value: an HTTP status, a stable code and
// an optional Retry-After, which handlers return and restapi's Server.fail
// renders as {"error":"<code>"}. It holds the type and the codes shared by
// restapi and the handler packages mounted under it (restapi/project); it
// writes nothing and maps no domain error (restapi's error table does).
package apierr
