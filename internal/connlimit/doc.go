// Package connlimit caps the client connections a process holds open: a
// net.Listener wrapper counts every accepted connection until it is
// closed (connections hijacked for WebSocket included, since they close
// through the same net.Conn), in total and per TCP peer address (an IPv6
// peer's /64).
//
// A connection over a cap is answered with a fixed
// "HTTP/1.1 503 Service Unavailable" carrying {"error":"overloaded"},
// Retry-After and Connection: close, written without parsing anything the
// client sent, and closed. Accept never returns an error for a refused
// connection, so http.Server.Serve keeps running. A Listener is safe for
// concurrent use.
package connlimit
