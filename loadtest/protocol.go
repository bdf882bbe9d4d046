package loadtest

import (
	"errors"
	"strconv"
	"strings"

	"github.com/segmentio/encoding/json"
)

// Realtime protocol (docs/realtime-protocol.md) as far as the load generator needs it.
const (
	// Subprotocol is the WebSocket subprotocol of the gateway.
	Subprotocol = "han.v1"
	// RealtimePath is the WebSocket endpoint.
	RealtimePath = "/v1/realtime"
	// DialogChannelPrefix is the Redis Pub/Sub channel prefix of a dialog.
	DialogChannelPrefix = "han:rt:dialog:"
	// EventName is the event name of broadcast load events; the gateway
	// forwards the bytes without decoding them, clients ignore unknown names.
	EventName = "loadtest.tick"
	// chatBodyPrefix starts a message body the chat scenarios send; the
	// scheduled send time follows in Unix nanoseconds.
	chatBodyPrefix = "lt:"
)

// Frame is a server → client frame decoded just enough for the load
// generator. Parsed with zero copy: its strings alias the read buffer and
// are valid only until the next read.
type Frame struct {
	Type string `json:"type"`
	// event
	ID       string          `json:"id"`
	Event    string          `json:"event"`
	DialogID string          `json:"dialogId"`
	Seq      int64           `json:"seq"`
	Data     json.RawMessage `json:"data"`
	// hello
	ConnectionID string `json:"connectionId"`
	Instance     string `json:"instance"`
	HeartbeatMs  int64  `json:"heartbeatMs"`
	// subscribed
	LastSeq int64 `json:"lastSeq"`
	// resync, error
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// ParseFrame decodes b into f (reset first).
func ParseFrame(b []byte, f *Frame) error {
	*f = Frame{}
	_, err := json.Parse(b, f, json.ZeroCopy)
	if err != nil {
		return err
	}
	if f.Type == "" {
		return errors.New("loadtest: frame without type")
	}
	return nil
}

// eventData is what the load generator reads from an event's data: the
// scheduled send time of a broadcast event (t) or the body of a chat
// message DTO that carries it, and the dialog's seq where the frame has no
// seq of its own (s: a Centrifugo publication).
type eventData struct {
	T    int64  `json:"t"`
	S    int64  `json:"s"`
	Body string `json:"body"`
}

// ScheduledNanos extracts the scheduled send time (Unix nanoseconds) the
// load generator embedded in an event's data; ok is false when there is
// none (an event some other client caused).
func ScheduledNanos(data []byte) (int64, bool) {
	ns, _, ok := eventStamp(data)
	return ns, ok
}

// eventStamp is ScheduledNanos plus the seq carried in the data (0 when
// none).
func eventStamp(data []byte) (scheduledNanos, seq int64, ok bool) {
	if len(data) == 0 {
		return 0, 0, false
	}
	var d eventData
	if _, err := json.Parse(data, &d, json.ZeroCopy); err != nil {
		return 0, 0, false
	}
	if d.T > 0 {
		return d.T, d.S, true
	}
	ns, ok := parseChatBody(d.Body)
	return ns, 0, ok
}

// ChatBody is a message body that carries the scheduled send time and is
// padded to size bytes (at least the prefix and the time).
func ChatBody(scheduledNanos int64, size int) string {
	b := strconv.AppendInt([]byte(chatBodyPrefix), scheduledNanos, 10)
	b = append(b, ':')
	for len(b) < size {
		b = append(b, 'x')
	}
	return string(b)
}

func parseChatBody(body string) (int64, bool) {
	rest, ok := strings.CutPrefix(body, chatBodyPrefix)
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(rest, ":")
	v, err := strconv.ParseInt(num, 10, 64)
	return v, err == nil && v > 0
}

// AppendEvent appends a complete `event` frame for a dialog,
// the bytes a publisher puts on the dialog's channel. Its data is
// {"t":<scheduled Unix ns>,"p":"xx…"} padded to exactly payload bytes (at
// least 40). The ids are UUIDs, so nothing needs escaping.
func AppendEvent(dst []byte, dialogID, eventID string, seq, scheduledNanos int64, payload int) []byte {
	dst = append(dst, `{"type":"event","channel":"dialog:`...)
	dst = append(dst, dialogID...)
	dst = append(dst, `","id":"`...)
	dst = append(dst, eventID...)
	dst = append(dst, `","event":"`+EventName+`","entityId":"`...)
	dst = append(dst, eventID...)
	dst = append(dst, `","dialogId":"`...)
	dst = append(dst, dialogID...)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	dst = append(dst, `,"data":`...)
	start := len(dst)
	dst = append(dst, `{"t":`...)
	dst = strconv.AppendInt(dst, scheduledNanos, 10)
	dst = append(dst, `,"p":"`...)
	// Close with `"}` at exactly payload bytes.
	for len(dst)-start < payload-2 {
		dst = append(dst, 'x')
	}
	dst = append(dst, `"}}`...)
	return dst
}

// MinEventPayload is the smallest data object AppendEvent can pad to.
const MinEventPayload = 40

// Client → server frames.

// SubscribeFrame asks for a dialog's events.
func SubscribeFrame(dialogID string) []byte {
	return []byte(`{"type":"subscribe","dialogId":"` + dialogID + `"}`)
}

// SubscribeSinceFrame is subscribe with sinceSeq: the server replays the
// dialog's message.created events with seq > sinceSeq before subscribed.
func SubscribeSinceFrame(dialogID string, sinceSeq int64) []byte {
	return []byte(`{"type":"subscribe","dialogId":"` + dialogID + `","sinceSeq":` + strconv.FormatInt(sinceSeq, 10) + `}`)
}

// PingFrame is the application-level ping (answered by pong).
var PingFrame = []byte(`{"type":"ping"}`)

// ScheduledNanosFromBody reads the scheduled send time from a message body
// written by ChatBody.
func ScheduledNanosFromBody(body string) (int64, bool) { return parseChatBody(body) }
