package pubsub

import (
	"bytes"
	"context"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A subscriber's Pub/Sub connections are read through a bulkLimiter, so a
// message larger than SubscriberConfig.MaxMessageBytes is never held in
// memory (Subscriber.deliver resyncs its channel instead).

// limitKey marks the context of a session: a connection dialled under it
// reads through a bulkLimiter of the given size.
type limitKey struct{}

func (s *Subscriber) limited(ctx context.Context) context.Context {
	return context.WithValue(ctx, limitKey{}, s.cfg.MaxMessageBytes)
}

// limitHook wraps the connections dialled for a session (their dial
// carries limitKey) in a bulkLimiter; every other dial of the client is
// left as it is.
type limitHook struct{}

func (limitHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if limit, ok := ctx.Value(limitKey{}).(int); ok && err == nil {
			if _, done := c.(*bulkLimiter); !done {
				c = &bulkLimiter{Conn: c, max: int64(limit), raw: make([]byte, 32<<10)}
			}
		}
		return c, err
	}
}

func (limitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (limitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// bulkLimiter reads a Pub/Sub connection for go-redis and never hands it
// a bulk string longer than max: go-redis allocates a bulk string whole as
// soon as it reads its length, so a 512 MB message published on a
// subscribed channel would otherwise be held, then forwarded, in full.
// It follows the RESP framing as the bytes pass (every element is a line
// that starts with its type; a bulk string's line gives its length, and
// that many bytes and CRLF follow) and replaces an oversized bulk string
// with an empty one, dropping its bytes as they arrive.
type bulkLimiter struct {
	net.Conn
	max   int64
	raw   []byte // read from the connection, raw[r:w] not yet processed
	r, w  int
	err   error  // the read error to return once raw is processed
	state int8   // what raw[r] is: see the limit* constants
	head  []byte // a bulk string's length line, while it is read
	pend  []byte // output that did not fit the caller's buffer
	left  int64  // bytes left to pass (limitData) or to drop (limitSkip)
}

const (
	limitType int8 = iota // the first byte of an element
	limitLine             // the rest of a line, passed as is
	limitHead             // a bulk string's length line, held
	limitData             // a bulk string's bytes and CRLF, passed
	limitSkip             // an oversized bulk string's bytes, dropped
)

// limitHeadMax: a longer "length line" is not one, and passes as a line.
const limitHeadMax = 32

func (l *bulkLimiter) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if n := l.process(p); n > 0 {
			return n, nil
		}
		if l.err != nil {
			err := l.err
			l.err = nil
			return 0, err
		}
		n, err := l.Conn.Read(l.raw)
		l.r, l.w, l.err = 0, n, err
	}
}

// process moves what it can of raw[r:w] to p and returns how many bytes
// it wrote.
func (l *bulkLimiter) process(p []byte) int {
	n := 0
	for n < len(p) && (len(l.pend) > 0 || l.r < l.w) {
		if len(l.pend) > 0 {
			k := copy(p[n:], l.pend)
			l.pend, n = l.pend[k:], n+k
			continue
		}
		in := l.raw[l.r:l.w]
		switch l.state {
		case limitType:
			l.state = limitLine
			if c := in[0]; c == '$' || c == '=' || c == '!' {
				l.state, l.head = limitHead, l.head[:0]
			}
		case limitLine, limitData:
			k := len(in)
			if l.state == limitData {
				k = int(min(int64(k), l.left))
				l.left -= int64(k)
			} else if i := bytes.IndexByte(in, '\n'); i >= 0 {
				k = i + 1
			}
			if l.state == limitLine && in[k-1] == '\n' || l.state == limitData && l.left == 0 {
				l.state = limitType
			}
			l.pend = in[:k]
			l.r += k
		case limitSkip:
			k := int(min(int64(len(in)), l.left))
			l.r, l.left = l.r+k, l.left-int64(k)
			if l.left == 0 {
				l.state, l.left = limitData, 2 // the CRLF that ends it
			}
		case limitHead:
			l.readHead(in)
		}
	}
	return n
}

// readHead takes a bulk string's length line from in and, once it is
// whole, queues it (or an empty string's in place of an oversized one).
func (l *bulkLimiter) readHead(in []byte) {
	k := len(in)
	if i := bytes.IndexByte(in, '\n'); i >= 0 {
		k = i + 1
	}
	l.head = append(l.head, in[:k]...)
	l.r += k
	if l.head[len(l.head)-1] != '\n' {
		if len(l.head) > limitHeadMax {
			l.state, l.pend = limitLine, l.head
		}
		return
	}
	l.state, l.pend = limitType, l.head
	size, err := strconv.ParseInt(string(bytes.TrimRight(l.head[1:], "\r\n")), 10, 64)
	switch {
	case err != nil || size < 0:
	case size > l.max:
		l.state, l.left, l.pend = limitSkip, size, []byte("$0\r\n")
	default:
		l.state, l.left = limitData, size+2
	}
}
