package gateway

import (
	"bytes"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
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
)

// Resync reasons.
const (
	ResyncSlowConsumer = "slow_consumer"
	ResyncReconnect    = "pubsub_reconnect"
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
	// classEphemeral events (typing, presence) are dropped first.
	classEphemeral
)

var eventField = []byte(`"event":"`)

// classify reads the event name of an event frame without decoding it (the
// frame is forwarded as is). Our frames put "event" near the start.
func classify(payload []byte) frameClass {
	i := bytes.Index(payload, eventField)
	if i < 0 {
		return classDurable
	}
	rest := payload[i+len(eventField):]
	if bytes.HasPrefix(rest, []byte(EventTyping+`"`)) || bytes.HasPrefix(rest, []byte(EventPresenceChanged+`"`)) {
		return classEphemeral
	}
	return classDurable
}

type helloFrame struct {
	Type         string `json:"type"`
	ConnectionID string `json:"connectionId"`
	Instance     string `json:"instance"`
	HeartbeatMs  int64  `json:"heartbeatMs"`
	ExpiresAt    int64  `json:"expiresAt"` // the credential's exp, epoch ms
}

// refreshedFrame answers a valid refresh: the connection now ends with the
// new token (its exp, epoch ms, plus the verifier's leeway).
type refreshedFrame struct {
	Type      string `json:"type"`
	ExpiresAt int64  `json:"expiresAt"`
}

type subscribedFrame struct {
	Type     string `json:"type"`
	DialogID string `json:"dialogId"`
	LastSeq  int64  `json:"lastSeq"`
}

type errorFrame struct {
	Type  string `json:"type"`
	Error string `json:"error"`
}

type resyncFrame struct {
	Type   string `json:"type"`
	Reason string `json:"reason"`
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

func encodeResync(reason string) []byte { return mustJSON(resyncFrame{Type: "resync", Reason: reason}) }

// inFrame is a client → server frame.
type inFrame struct {
	Type     string `json:"type"`
	DialogID string `json:"dialogId"`
	Token    string `json:"token"` // refresh
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

type typingData struct {
	UserID string `json:"userId"`
}

type presenceData struct {
	UserID     string `json:"userId"`
	Online     bool   `json:"online"`
	LastSeenAt *int64 `json:"lastSeenAt"`
}
