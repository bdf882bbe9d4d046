package gateway

import (
	"time"

	"github.com/coder/websocket"
)

// Subprotocol is the only WebSocket subprotocol the gateway speaks.
const Subprotocol = "han.v1"

// Close codes (docs/realtime-protocol.md).
const (
	CloseGoingAway     = websocket.StatusGoingAway       // 1001: drain; reason {"retryMs":n}
	CloseUnsupported   = websocket.StatusUnsupportedData // 1003: a binary frame
	ClosePolicy        = websocket.StatusPolicyViolation // 1008: bad Origin, frame too big or too slow, frame rate, subprotocol, per-user connection cap
	CloseInternal      = websocket.StatusInternalError   // 1011
	CloseTryAgainLater = websocket.StatusTryAgainLater   // 1013: Redis DB1 or PostgreSQL unavailable (the user channel not confirmed in time included), or the handshake queue full; reason {"retryMs":n} for the queue
	CloseUnauthorized  = websocket.StatusCode(4001)      // no valid ticket or token; reason token_expired: the credential expired
	CloseForbidden     = websocket.StatusCode(4003)      // not a user session, or a refresh token of another user
	CloseSlowConsumer  = websocket.StatusCode(4008)      // cannot keep up
)

// CloseReasonTooManyConnections is the reason of the 1008 close that
// refuses a connection beyond the user's connection cap
// (presence.Config.MaxConnsPerUser), and the label of that rejection in
// han_ws_rejected_total.
const CloseReasonTooManyConnections = "too_many_connections"

// CloseReasonTokenExpired is the reason of the 4001 close that ends a
// connection once the credential it was opened with (or last refreshed
// with) expired: its exp plus the token verifier's leeway has passed.
const CloseReasonTokenExpired = "token_expired"

// Close reasons of 4003.
const (
	CloseReasonUserSession  = "user session required" // a service token, at connect or in a refresh
	CloseReasonUserMismatch = "user mismatch"         // a refresh with another user's token
)

// Config tunes the WebSocket hub. Every zero value picks the default shown.
type Config struct {
	InstanceID string // required; reported in hello

	// AllowedOrigins are the exact Origin values accepted
	// (HAN_ALLOWED_ORIGINS). A request with an Origin not listed is closed
	// with 1008; a request without Origin is accepted only with bearer auth.
	AllowedOrigins []string

	// MaxFrameBytes is the largest inbound frame. Zero value means 4096.
	// On the wire a frame may take at most twice that, its fragments'
	// headers and the control frames sent between them included.
	MaxFrameBytes int
	// FrameTimeout bounds the read of one inbound frame from its first byte:
	// a frame whose fragments are not all in by then closes the
	// connection with 1008. The wait between frames has no bound (idle
	// connections are the norm). Zero value means 5s.
	FrameTimeout time.Duration
	// CloseTimeout bounds the close handshake's reads: once the server's
	// close frame is out, the client's must come within it, after at most
	// the rest of a frame in progress and a few control frames (a frame's
	// bound on the wire); past either the socket is closed without waiting
	// further. The library's own wait bounds only the frame headers, so a
	// client that declared a huge frame and stopped, or kept sending, held
	// the socket and its goroutine. Zero value means 5s.
	CloseTimeout time.Duration
	// FrameRate and FrameBurst are the inbound token bucket per connection
	// (frames per second, bucket size); WebSocket pings and pongs the
	// client sends take a token each too. Zero values mean 20 and 60.
	FrameRate  float64
	FrameBurst int
	// MaxSubscriptions per connection. Zero value means 200.
	MaxSubscriptions int
	// TypingInterval: at most one typing event per connection and dialog
	// per interval; extra typing frames are dropped. Zero value means 1s.
	TypingInterval time.Duration

	// QueueFrames and QueueBytes bound a connection's outbound queue, and
	// the live events each of its subscriptions holds until its subscribed
	// frame is queued. QueueFrames bounds each of them; QueueBytes bounds
	// the queue's frames, those its writer has taken and not yet written
	// (a batch blocked on a client that stopped reading), and every
	// subscription's held events together, so one socket holds no more
	// however many dialogs it subscribes to and however its frames are
	// split between queue and writer.
	// Zero values mean 256 frames and 1 MiB; QueueBytes is at most 1 GiB.
	QueueFrames int
	QueueBytes  int
	// MaxOverflows: a connection whose queue overflows more than this many
	// times within OverflowWindow is closed with 4008. Zero values mean 3
	// and 1 minute.
	MaxOverflows   int
	OverflowWindow time.Duration
	// SendBuffer, when set, caps the kernel send buffer (SO_SNDBUF) of each
	// connection, bounding the kernel memory a stuck client can pin. Zero
	// value means the kernel's autotuned default (up to tcp_wmem's maximum,
	// often 4 MiB).
	SendBuffer int
	// WriteTimeout bounds one batch of writes; a connection that accepts
	// nothing for this long (at most half as long again: the socket's
	// deadline is reused across batches while a whole timeout of it is
	// left) is closed as a slow consumer. Zero value means 10s.
	WriteTimeout time.Duration

	// PresenceDelay: a presence.changed frame waits up to this long (and
	// at most 1s, the hub's scan) for other frames to the same
	// connection, so the transitions of many users (a connect storm, a
	// large group coming online) reach a socket in a few writes instead of
	// one each; any other frame takes the waiting ones along at once, and
	// so does a queue of 32 frames. Zero value means 1s; negative: written
	// at once.
	PresenceDelay time.Duration

	// PingInterval is the WebSocket ping period (also hello.heartbeatMs).
	// Zero value means 25s. PongTimeout bounds the wait for the pong; zero
	// value means 10s.
	PingInterval time.Duration
	PongTimeout  time.Duration

	// SubscribeTimeout bounds a subscribe (Redis confirmation + lastSeq).
	// Zero value means 5s.
	SubscribeTimeout time.Duration
	// AuthTimeout bounds the verification of a refresh frame's token (it
	// may wait for a JWKS refetch); the reader handles no other frame of
	// the connection meanwhile. Zero value means 5s.
	AuthTimeout time.Duration

	// Drain: connections are closed with 1001 in batches of DrainBatch
	// every DrainInterval; each gets a reconnect delay drawn from
	// [RetryMin, RetryMax]. Zero values mean 500, 50ms, 500ms and 5s.
	DrainBatch    int
	DrainInterval time.Duration
	RetryMin      time.Duration
	RetryMax      time.Duration

	// TicketTTL is the lifetime of a one-time ticket. Zero value means 30s.
	TicketTTL time.Duration

	// Handshake admission (admission.go): at most HandshakeConcurrency
	// handshakes do their Redis and PostgreSQL work at once
	// (HAN_WS_HANDSHAKE_CONCURRENCY; the service sizes it from its pools;
	// zero value means 64). The others wait in a FIFO queue of at most
	// HandshakeQueue (HAN_WS_HANDSHAKE_QUEUE; zero value means 16384) for at
	// most HandshakeWait (HAN_WS_HANDSHAKE_WAIT; zero value means 6s);
	// beyond either bound a handshake is closed with 1013 and a reconnect
	// delay drawn from [RetryMin, RetryMax].
	HandshakeConcurrency int
	HandshakeQueue       int
	HandshakeWait        time.Duration
	// UserHandshakeRate and UserHandshakeBurst bound one user's handshakes
	// on this instance (userrate.go): UserHandshakeRate a second
	// (HAN_WS_USER_HANDSHAKE_RATE; zero value means 1), at most
	// UserHandshakeBurst at once (HAN_WS_USER_HANDSHAKE_BURST; zero value
	// means 32). A handshake over them is closed with 1013 and a reconnect
	// delay: the time until the user has a token again plus one drawn from
	// [RetryMin, RetryMax], at most five minutes (maxRetryAdvice). Any
	// values are safe (bucketShape); the service takes 0.001 to 1000 and 1
	// to 1,000,000.
	UserHandshakeRate  float64
	UserHandshakeBurst int

	// Recovery of a subscribe with sinceSeq: the missed message.created
	// events are replayed over the socket when there are at most
	// RecoverMax of them (HAN_WS_RECOVER_MAX; zero value means 100), their
	// frames total at most RecoverBytes (zero value means 256 KiB) and each
	// was written within RecoverWindow (HAN_WS_RECOVER_WINDOW, which must
	// not exceed the outbox retention; zero value means 10m). Otherwise the
	// client gets a resync for that dialog. A recovery read builds no more
	// than RecoverBytes of frames (store.Store.RecoverDialog).
	RecoverWindow time.Duration
	RecoverMax    int
	RecoverBytes  int
	// RecoverLinger is how long one recovery read keeps serving later
	// subscribes to its dialog on this instance (it keeps the dialog's
	// events dispatched since the read began, so a later subscriber misses
	// nothing). Zero value means 2s.
	RecoverLinger time.Duration
	// RecoverReadRate and RecoverReadBurst bound, per user, the recovery
	// reads this instance makes for their subscribes (a subscribe served
	// by a read of the dialog already under way or lingering costs none):
	// RecoverReadRate a second (zero value means 2), at most
	// RecoverReadBurst at once (zero value means 200, a reconnect of one
	// socket holding as many subscriptions as it may). A subscribe past
	// them is answered with the dialog's resync instead of a replay. Any
	// values are safe (bucketShape).
	RecoverReadRate  float64
	RecoverReadBurst int
}

func (c *Config) defaults() {
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	num := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	num(&c.MaxFrameBytes, 4096)
	dur(&c.FrameTimeout, 5*time.Second)
	dur(&c.CloseTimeout, 5*time.Second)
	if c.FrameRate <= 0 {
		c.FrameRate = 20
	}
	num(&c.FrameBurst, 60)
	num(&c.MaxSubscriptions, 200)
	dur(&c.TypingInterval, time.Second)
	num(&c.QueueFrames, 256)
	num(&c.QueueBytes, 1<<20)
	c.QueueBytes = min(c.QueueBytes, 1<<30) // sub.pendingBytes and conn.pendingBytes are int32s
	num(&c.MaxOverflows, 3)
	dur(&c.OverflowWindow, time.Minute)
	dur(&c.WriteTimeout, 10*time.Second)
	dur(&c.PingInterval, 25*time.Second)
	if c.PresenceDelay == 0 {
		c.PresenceDelay = time.Second
	}
	dur(&c.PongTimeout, 10*time.Second)
	dur(&c.SubscribeTimeout, 5*time.Second)
	dur(&c.AuthTimeout, 5*time.Second)
	num(&c.DrainBatch, 500)
	dur(&c.DrainInterval, 50*time.Millisecond)
	dur(&c.RetryMin, 500*time.Millisecond)
	dur(&c.RetryMax, 5*time.Second)
	if c.RetryMax < c.RetryMin {
		c.RetryMax = c.RetryMin
	}
	dur(&c.TicketTTL, 30*time.Second)
	num(&c.HandshakeConcurrency, 64)
	num(&c.HandshakeQueue, 16384)
	dur(&c.HandshakeWait, 6*time.Second)
	if c.UserHandshakeRate <= 0 {
		c.UserHandshakeRate = 1
	}
	num(&c.UserHandshakeBurst, 32)
	dur(&c.RecoverWindow, 10*time.Minute)
	num(&c.RecoverMax, 100)
	num(&c.RecoverBytes, 256<<10)
	dur(&c.RecoverLinger, 2*time.Second)
	if c.RecoverReadRate <= 0 {
		c.RecoverReadRate = 2
	}
	num(&c.RecoverReadBurst, 200)
}
