// Package wsedge serves WebSocket upgrade requests for one path itself,
// in front of net/http, and hands every other connection to net/http
// untouched.
//
// net/http gives each connection a 4 KiB reader and a 4 KiB writer from
// its pools, and its hijack adds a new 4 KiB writer; a hijacked connection
// never returns the pooled two, so in a storm of WebSocket handshakes every
// one allocates and drops 12 KiB, and starts and stops a background read
// goroutine besides. A Listener looks at what a new connection sent
// without taking it off the socket (MSG_PEEK). When that is a whole,
// well-formed HTTP/1.1 GET of the path asking for a WebSocket upgrade
// within one small buffer, it reads exactly the request off the socket,
// runs the handler on it (which hijacks the connection), and answers a
// handler that does not hijack with Connection: close. Anything else — an
// other path or method, a header larger than the buffer, anything
// malformed — goes to net/http's Accept with nothing read, and net/http
// answers it as it always would. A client that sends nothing, or trickles
// bytes, is closed when the header timeout passes, as net/http does.
package wsedge
