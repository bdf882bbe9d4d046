package pubsub

import (
	"strings"

	"github.com/segmentio/encoding/json"
)

// Redis Pub/Sub channel names (docs/redis-keys.md).
const (
	dialogChannelPrefix = "han:rt:dialog:"
	userChannelPrefix   = "han:rt:user:"
)

// DialogChannel is the Pub/Sub channel of a dialog.
func DialogChannel(dialogID string) string { return dialogChannelPrefix + dialogID }

// DialogOfChannel is the dialog id of a DialogChannel name: a part of the
// string, not a copy.
func DialogOfChannel(channel string) string { return strings.TrimPrefix(channel, dialogChannelPrefix) }

// UserChannel is the Pub/Sub channel of a user.
func UserChannel(userID string) string { return userChannelPrefix + userID }

// Event is the server → client `event` frame (docs/realtime-protocol.md). Its
// JSON text is exactly what is published on the Redis channel, so an instance
// forwards the bytes to local sockets without decoding them.
type Event struct {
	Type     string          `json:"type"`    // always "event"
	Channel  string          `json:"channel"` // "dialog:<id>" or "user:<id>"
	ID       string          `json:"id"`      // event id (UUID); duplicates carry the same id
	Event    string          `json:"event"`   // e.g. message.created
	EntityID string          `json:"entityId"`
	DialogID string          `json:"dialogId,omitempty"`
	Seq      int64           `json:"seq,omitempty"`
	Data     json.RawMessage `json:"data"`
}

// NewDialogEvent builds an event for a dialog channel.
func NewDialogEvent(id, event, entityID, dialogID string, seq int64, data []byte) Event {
	return Event{Type: "event", Channel: "dialog:" + dialogID, ID: id, Event: event,
		EntityID: entityID, DialogID: dialogID, Seq: seq, Data: data}
}

// Encode renders the frame once; the bytes are published and forwarded as is.
func (e Event) Encode() ([]byte, error) { return json.Marshal(e) }

// EventMessageCreated is the event of a message committed to a dialog.
const EventMessageCreated = "message.created"

// Message is a chat message as clients see it: the data of a
// message.created event, and the body the REST API answers for a message.
type Message struct {
	ID          string       `json:"id"`
	DialogID    string       `json:"dialogId"`
	Seq         int64        `json:"seq"`
	SenderID    string       `json:"senderId"`
	Body        string       `json:"body"`
	CreatedAt   int64        `json:"createdAt"`   // Unix milliseconds
	Attachments []Attachment `json:"attachments"` // always an array, [] when none
}

// Attachment is an attachment as a message carries it.
type Attachment struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"contentType"`
	SizeBytes   int64  `json:"sizeBytes"`
}

// MessageCreated builds the message.created frame of a committed message
// under its event id: the bytes clients receive, encoded once. It is the
// only builder of that frame, and the frame depends on nothing but its
// arguments, so building it again from the stored message (the outbox
// relay does) gives the same bytes as the request path's first build.
func MessageCreated(eventID string, m Message) ([]byte, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return NewDialogEvent(eventID, EventMessageCreated, m.ID, m.DialogID, m.Seq, data).Encode()
}
