package loadtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/segmentio/encoding/json"
)

// Centrifugo as a comparison target: its JSON client protocol over
// WebSocket (as far as connect, subscribe and publications go) and the
// message its Redis engine carries on Pub/Sub, so the load generator can
// feed it by a raw PUBLISH the way it feeds the gateway.
const (
	// CentrifugoPath is Centrifugo's bidirectional WebSocket endpoint.
	CentrifugoPath = "/connection/websocket"
	// CentrifugoDialogNamespace is the channel namespace the dialogs use
	// on Centrifugo (loadtest/centrifugo/config.json declares it).
	CentrifugoDialogNamespace = "dialog:"
	// CentrifugoRedisPrefix is the default prefix of Centrifugo's Redis
	// keys and channels.
	CentrifugoRedisPrefix = "centrifugo"
	// centrifugoConnectID is the command id of the connect command; later
	// commands on a connection count up from it.
	centrifugoConnectID = 1
)

// CentrifugoChannel is the Centrifugo channel of a dialog.
func CentrifugoChannel(dialogID string) string { return CentrifugoDialogNamespace + dialogID }

// CentrifugoRedisChannel is the Redis Pub/Sub channel on which a
// non-cluster Centrifugo Redis engine with the given prefix carries the
// publications of channel.
func CentrifugoRedisChannel(prefix, channel string) string {
	return prefix + ".client." + channel
}

// Protobuf field tags of the Publication message Centrifugo's Redis engine
// publishes: data is field 4 (length-delimited), time field 9 (varint,
// Unix milliseconds).
const (
	pbPublicationData = 4<<3 | 2
	pbPublicationTime = 9<<3 | 0
)

// AppendCentrifugoPublication appends the message Centrifugo's Redis
// engine puts on a channel for a publication without history: a protobuf
// Publication holding data and the publish time in Unix milliseconds. With
// history off no stream-position header precedes it, so Centrifugo passes
// data to the channel's subscribers as it is (a JSON value for JSON
// clients).
func AppendCentrifugoPublication(dst, data []byte, unixMillis int64) []byte {
	dst = append(dst, pbPublicationData)
	dst = binary.AppendUvarint(dst, uint64(len(data)))
	dst = append(dst, data...)
	if unixMillis != 0 {
		dst = append(dst, pbPublicationTime)
		dst = binary.AppendUvarint(dst, uint64(unixMillis))
	}
	return dst
}

// AppendCentrifugoData appends a publication's data for Centrifugo:
// {"t":<scheduled Unix ns>,"s":<seq>,"p":"xx…"} padded to payload bytes
// (longer when payload is too small to hold the numbers). Centrifugo
// carries no per-channel sequence without history, so the dialog's seq
// travels in the data, where the generator's duplicate check reads it.
func AppendCentrifugoData(dst []byte, seq, scheduledNanos int64, payload int) []byte {
	start := len(dst)
	dst = append(dst, `{"t":`...)
	dst = strconv.AppendInt(dst, scheduledNanos, 10)
	dst = append(dst, `,"s":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	dst = append(dst, `,"p":"`...)
	for len(dst)-start < payload-2 {
		dst = append(dst, 'x')
	}
	return append(dst, `"}`...)
}

// centrifugoConnectCommand is the first command on a Centrifugo
// connection: authenticate with a connection JWT. Tokens and channel names
// are ASCII (base64url and dots, "dialog:" and a UUID), for which Go's
// quoting is JSON's.
func centrifugoConnectCommand(token string) []byte {
	b := append([]byte(`{"id":`), strconv.Itoa(centrifugoConnectID)...)
	b = append(b, `,"connect":{"token":`...)
	b = strconv.AppendQuote(b, token)
	return append(b, `,"name":"han-loadtest"}}`...)
}

// centrifugoSubscribeCommand asks for a channel's publications.
func centrifugoSubscribeCommand(id uint32, channel string) []byte {
	b := append([]byte(`{"id":`), strconv.FormatUint(uint64(id), 10)...)
	b = append(b, `,"subscribe":{"channel":`...)
	b = strconv.AppendQuote(b, channel)
	return append(b, `}}`...)
}

// centrifugoPong answers a server ping (an empty reply).
var centrifugoPong = []byte(`{}`)

// centrifugoReply is one Centrifugo reply decoded just enough: a command's
// result or error (id > 0), a push (id 0), or a ping (nothing set). Parsed
// with zero copy: it aliases the read buffer.
type centrifugoReply struct {
	ID    uint32 `json:"id"`
	Error struct {
		Code    uint32 `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Connect struct {
		Client string `json:"client"`
		Pong   bool   `json:"pong"`
	} `json:"connect"`
	Subscribe json.RawMessage `json:"subscribe"`
	Push      struct {
		Channel string `json:"channel"`
		Pub     struct {
			Data json.RawMessage `json:"data"`
		} `json:"pub"`
	} `json:"push"`
}

// isPing reports whether r is a server ping, which an empty object is.
func (r *centrifugoReply) isPing() bool {
	return r.ID == 0 && r.Push.Channel == "" && len(r.Push.Pub.Data) == 0
}

// errCentrifugoEmpty is a message without any reply in it.
var errCentrifugoEmpty = errors.New("loadtest: empty Centrifugo message")

// eachCentrifugoReply calls f for every reply of a WebSocket message:
// Centrifugo batches several newline-separated JSON replies into one.
func eachCentrifugoReply(msg []byte, r *centrifugoReply, f func(*centrifugoReply)) error {
	seen := false
	for len(msg) > 0 {
		line := msg
		if i := bytes.IndexByte(msg, '\n'); i >= 0 {
			line, msg = msg[:i], msg[i+1:]
		} else {
			msg = nil
		}
		if len(line) == 0 {
			continue
		}
		*r = centrifugoReply{}
		if _, err := json.Parse(line, r, json.ZeroCopy); err != nil {
			return err
		}
		seen = true
		f(r)
	}
	if !seen {
		return errCentrifugoEmpty
	}
	return nil
}
