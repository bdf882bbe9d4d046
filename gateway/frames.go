package gateway

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/pubsub"
)

// Event names of the realtime protocol that this package produces or
// treats specially.
const (
	EventTyping          = "typing"
	EventPresenceChanged = "presence.changed"
)

// Frame error codes (error {error}).
const (
	errInvalidFrame         = "invalid_frame"
	errUnknownType          = "unknown_type"
	errInvalidUUID          = "invalid_uuid"
	errDialogNotFound       = "dialog_not_found"
	errTooManySubscriptions = "too_many_subscriptions"
	errNotSubscribed        = "not_subscribed"
	errUnavailable          = "unavailable"
	errUnauthorized         = "unauthorized" // a refresh token that fails verification
	// errRateLimited: a refresh sent while its client's budget of refused
	// credentials is spent; the frame carries retryMs.
	errRateLimited = "rate_limited"
)

// Resync reasons.
const (
	ResyncSlowConsumer = "slow_consumer"
	ResyncReconnect    = "pubsub_reconnect"
	// ResyncRecoveryUnavailable: a subscribe's sinceSeq could not be served
	// over the socket (too many or too large missed events, or older than
	// the recovery window); the resync names the dialog.
	ResyncRecoveryUnavailable = "recovery_unavailable"
)

// frameClass decides what happens to a frame when a queue is full.
type frameClass uint8

const (
	// classControl frames (hello, subscribed, error, pong, resync) are
	// never dropped.
	classControl frameClass = iota
	// classDurable events are never dropped silently: on overflow they are
	// replaced by one resync (the client reconciles over REST).
	classDurable
	// classEphemeral events (typing) are dropped first.
	classEphemeral
	// classPresence events (presence.changed) are dropped like ephemeral
	// ones and may wait for the hub's next scan before they are written
	// (Config.PresenceDelay), so a burst of transitions shares writes.
	classPresence
)

// ephemeral reports whether frames of class k are dropped first.
func (k frameClass) ephemeral() bool { return k >= classEphemeral }

var eventField = []byte(`"event":"`)

// classify reads the event name of an event frame without decoding it (the
// frame is forwarded as is). Our frames put "event" near the start.
func classify(payload []byte) frameClass {
	i := bytes.Index(payload, eventField)
	if i < 0 {
		return classDurable
	}
	rest := payload[i+len(eventField):]
	switch {
	case bytes.HasPrefix(rest, []byte(EventTyping+`"`)):
		return classEphemeral
	case bytes.HasPrefix(rest, []byte(EventPresenceChanged+`"`)):
		return classPresence
	}
	return classDurable
}

type helloFrame struct {
	Type         string `json:"type"`
	ConnectionID string `json:"connectionId"`
	Instance     string `json:"instance"`
	HeartbeatMs  int64  `json:"heartbeatMs"`
	ExpiresAt    int64  `json:"expiresAt"` // the credential's exp, epoch ms
	// ServerTime is this instance's clock (epoch ms) when the frame is
	// built: a client whose own clock is off measures expiresAt against it.
	ServerTime int64 `json:"serverTime"`
}

// refreshedFrame answers a valid refresh: the connection now ends with the
// new token (its exp, epoch ms, plus the verifier's leeway); ServerTime
// as in helloFrame.
type refreshedFrame struct {
	Type       string `json:"type"`
	ExpiresAt  int64  `json:"expiresAt"`
	ServerTime int64  `json:"serverTime"`
}

type subscribedFrame struct {
	Type     string `json:"type"`
	DialogID string `json:"dialogId"`
	LastSeq  int64  `json:"lastSeq"`
	// Recovered answers a subscribe with sinceSeq: true when the missed
	// events were sent before this frame, false after a resync. Absent
	// without sinceSeq.
	Recovered *bool `json:"recovered,omitempty"`
}

type errorFrame struct {
	Type  string `json:"type"`
	Error string `json:"error"`
	// RetryMs is the wait advised before the frame is sent again, in ms
	// (rate_limited only; absent otherwise).
	RetryMs int64 `json:"retryMs,omitempty"`
}

type resyncFrame struct {
	Type     string `json:"type"`
	Reason   string `json:"reason"`
	DialogID string `json:"dialogId,omitempty"` // set when one dialog is concerned
}

var pongFrame = []byte(`{"type":"pong"}`)

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs of strings and integers always encode
	}
	return b
}

func encodeError(code string) []byte { return mustJSON(errorFrame{Type: "error", Error: code}) }

// encodeRetryError is an error frame advising a retry after retryMs.
func encodeRetryError(code string, retryMs int64) []byte {
	return mustJSON(errorFrame{Type: "error", Error: code, RetryMs: retryMs})
}

func encodeResync(reason string) []byte { return mustJSON(resyncFrame{Type: "resync", Reason: reason}) }

func encodeDialogResync(reason, dialogID string) []byte {
	return mustJSON(resyncFrame{Type: "resync", Reason: reason, DialogID: dialogID})
}

// inFrame is a client → server frame.
type inFrame struct {
	Type     string `json:"type"`
	DialogID string `json:"dialogId"`
	Token    string `json:"token"`             // refresh
	Since    optSeq `json:"sinceSeq,omitzero"` // subscribe
}

// optSeq is an optional seq: a JSON number made of decimal digits only
// that fits an int64. Anything else (null, a sign, a fraction, an
// exponent, a string) fails the decoding of its frame.
type optSeq struct {
	n   int64
	set bool
}

var errBadSeq = errors.New("gateway: sinceSeq must be an integer ≥ 0")

func (o *optSeq) UnmarshalJSON(b []byte) error {
	n, ok := parseSeq(b)
	if !ok {
		return errBadSeq
	}
	*o = optSeq{n: n, set: true}
	return nil
}

func (o optSeq) MarshalJSON() ([]byte, error) { return strconv.AppendInt(nil, o.n, 10), nil }

// value is the seq, -1 when absent.
func (o optSeq) value() int64 {
	if !o.set {
		return -1
	}
	return o.n
}

// parseInFrame strictly decodes a client frame (jsonx: invalid UTF-8,
// lone surrogates and duplicate keys are refused).
func parseInFrame(b []byte) (inFrame, bool) {
	var f inFrame
	if err := jsonx.DecodeObject(b, &f); err != nil || f.Type == "" {
		return inFrame{}, false
	}
	return f, true
}

// parseSeq parses a JSON number made of decimal digits only that fits an
// int64.
func parseSeq(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

var (
	seqField       = []byte(`,"seq":`)
	dataField      = []byte(`,"data":`)
	messageCreated = []byte(pubsub.EventMessageCreated + `"`)
)

// createdSeq is the seq of a message.created event frame, read without
// decoding it; 0 for any other frame. The frame's own fields come before
// its data, in pubsub.Event's order, and a field name cannot appear inside
// a JSON string unescaped, so the frame's event is the first "event" and
// its seq a "seq" before "data": what follows is the data, which an inbox
// event's service chooses freely ({"event":"message.created","seq":3} is
// no message).
func createdSeq(payload []byte) int64 {
	e := bytes.Index(payload, eventField)
	if e < 0 || !bytes.HasPrefix(payload[e+len(eventField):], messageCreated) {
		return 0
	}
	i := bytes.Index(payload, seqField)
	if d := bytes.Index(payload, dataField); i < 0 || (d >= 0 && d < i) {
		return 0
	}
	rest := payload[i+len(seqField):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, ok := parseSeq(rest[:j])
	if !ok {
		return 0
	}
	return n
}

type typingData struct {
	UserID string `json:"userId"`
}

type presenceData struct {
	UserID     string `json:"userId"`
	Online     bool   `json:"online"`
	LastSeenAt *int64 `json:"lastSeenAt"`
	// ChangedAt (epoch ms, Redis's clock) orders one user's transitions
	// published by different instances: a client keeps the latest.
	ChangedAt int64 `json:"changedAt"`
}
