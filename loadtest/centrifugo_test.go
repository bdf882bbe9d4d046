package loadtest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// The expected bytes below were produced by Centrifugo's own encoders (its
// Publication's protobuf marshaller, its JSON reply encoder), so they are
// Centrifugo's wire format, not this package's idea of it.

var (
	cfTestData = `{"t":1764657600123456789,"s":7,"p":"` + strings.Repeat("x", 124) + `"}`
	// Publication{Data: cfTestData, Time: 1764657600123}: data as field 4
	// with a two-byte length (162), time as field 9.
	cfTestPublicationHex = "22a2017b2274223a313736343635373630303132333435363738392c2273223a372c2270223a22787878787878787878" +
		"787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878" +
		"787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878" +
		"78787878787878787878787878787878787878227d48fbaca8eead33"
)

func TestCentrifugoPublicationIsCentrifugosRedisMessage(t *testing.T) {
	data := AppendCentrifugoData(nil, 7, 1764657600123456789, len(cfTestData))
	if string(data) != cfTestData {
		t.Fatalf("data\n got %s\nwant %s", data, cfTestData)
	}
	want, err := hex.DecodeString(cfTestPublicationHex)
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("kept")
	got := AppendCentrifugoPublication(prefix, data, 1764657600123)
	if !bytes.Equal(got[:4], []byte("kept")) || !bytes.Equal(got[4:], want) {
		t.Fatalf("publication\n got %x\nwant kept+%x", got, want)
	}
	// Publication{Data: {"a":1}}: no time field when the time is zero.
	if got := hex.EncodeToString(AppendCentrifugoPublication(nil, []byte(`{"a":1}`), 0)); got != "22077b2261223a317d" {
		t.Fatalf("publication without time: got %s", got)
	}
	// The data is valid JSON the duplicate check reads the seq from.
	if !json.Valid(data) {
		t.Fatalf("data is not JSON: %s", data)
	}
	ns, seq, ok := eventStamp(data)
	if !ok || ns != 1764657600123456789 || seq != 7 {
		t.Fatalf("eventStamp = %d, %d, %v", ns, seq, ok)
	}
	// Too small a payload still carries the numbers in valid JSON.
	if small := AppendCentrifugoData(nil, 12, 99, 10); !json.Valid(small) || !bytes.Contains(small, []byte(`"s":12`)) {
		t.Fatalf("small data: %s", small)
	}
}

func TestCentrifugoChannels(t *testing.T) {
	ch := CentrifugoChannel("0b8f6c1e-1d5a-4a62-9d0e-1c1f3c4d5e6f")
	if ch != "dialog:0b8f6c1e-1d5a-4a62-9d0e-1c1f3c4d5e6f" {
		t.Fatalf("channel %q", ch)
	}
	if got := CentrifugoRedisChannel("centrifugo", ch); got != "centrifugo.client.dialog:0b8f6c1e-1d5a-4a62-9d0e-1c1f3c4d5e6f" {
		t.Fatalf("redis channel %q", got)
	}
}

func TestCentrifugoCommands(t *testing.T) {
	var conn struct {
		ID      uint32 `json:"id"`
		Connect struct {
			Token string `json:"token"`
		} `json:"connect"`
	}
	if err := json.Unmarshal(centrifugoConnectCommand(`a.b"c`), &conn); err != nil || conn.ID != 1 || conn.Connect.Token != `a.b"c` {
		t.Fatalf("connect command: %+v, %v", conn, err)
	}
	var sub struct {
		ID        uint32 `json:"id"`
		Subscribe struct {
			Channel string `json:"channel"`
		} `json:"subscribe"`
	}
	if err := json.Unmarshal(centrifugoSubscribeCommand(5, "dialog:x"), &sub); err != nil || sub.ID != 5 || sub.Subscribe.Channel != "dialog:x" {
		t.Fatalf("subscribe command: %+v, %v", sub, err)
	}
}

// newTestCentrifugoConn is a connection whose read side is driven by the
// test: replies go through centrifugoMessage as the read loop would pass
// them.
func newTestCentrifugoConn(dl *Deliveries, reg *Registry) *WSConn {
	d := NewWSDialer(reg, nil, dl)
	d.Protocol = ProtocolCentrifugo
	return &WSConn{d: d, helloCh: make(chan struct{}), done: make(chan struct{}), subs: map[string]*seqTracker{}}
}

func TestCentrifugoRepliesDriveTheConnection(t *testing.T) {
	reg := NewRegistry()
	dl := NewDeliveries(reg)
	w := newTestCentrifugoConn(dl, reg)
	var (
		r     centrifugoReply
		f     Frame
		hello bool
	)
	feed := func(msg string) error {
		return w.centrifugoMessage([]byte(msg), &r, &f, time.Now(), &hello)
	}
	if err := feed(`{"id":1,"connect":{"client":"c1d2","version":"6.9.1","ping":25,"pong":false}}`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.helloCh:
	default:
		t.Fatal("the connect reply did not count as hello")
	}
	if w.ConnectionID != "c1d2" {
		t.Fatalf("connection id %q", w.ConnectionID)
	}

	// A subscribe in flight, as Subscribe leaves it.
	const dialog = "abc"
	p := &pendingSub{dialogID: dialog, cmdID: 2, done: make(chan struct{})}
	w.subs[dialog], w.pending = &seqTracker{}, p
	if err := feed(`{"id":7,"subscribe":{}}`); err != nil { // not its id
		t.Fatal(err)
	}
	select {
	case <-p.done:
		t.Fatal("a reply to another command completed the subscribe")
	default:
	}
	// Centrifugo batches replies, newline-separated, in one message: the
	// subscribe reply, a ping and publications (one repeated) must all count.
	pub := func(seq int) string {
		return `{"push":{"channel":"dialog:abc","pub":{"data":` + string(AppendCentrifugoData(nil, int64(seq), time.Now().UnixNano(), 64)) + `,"time":1764657600123}}}`
	}
	batch := strings.Join([]string{`{"id":2,"subscribe":{}}`, `{}`, pub(1), pub(2), pub(2),
		`{"push":{"channel":"dialog:abc","join":{"info":{"user":"u","client":"c"}}}}`, pub(4)}, "\n")
	for _, seq := range []int64{1, 2, 4} {
		dl.Published(dialog, seq, 1)
	}
	if err := feed(batch); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("subscribe failed: %v", p.err)
		}
	default:
		t.Fatal("the subscribe reply did not complete the subscribe")
	}
	if got := dl.Received(); got != 3 {
		t.Fatalf("unique deliveries %d, want 3 (seqs 1, 2, 4)", got)
	}
	if got := dl.duplicates.Value(); got != 1 {
		t.Fatalf("duplicates %d, want 1", got)
	}

	// A refused subscribe surfaces Centrifugo's error code.
	p2 := &pendingSub{dialogID: "other", cmdID: 3, done: make(chan struct{})}
	w.subs["other"], w.pending = &seqTracker{}, p2
	if err := feed(`{"id":3,"error":{"code":103,"message":"permission denied"}}`); err != nil {
		t.Fatal(err)
	}
	<-p2.done
	var refused *ErrSubscribeRefused
	if !errors.As(p2.err, &refused) || refused.Code != "centrifugo_103" {
		t.Fatalf("refused subscribe: %v", p2.err)
	}

	// A refused connect ends the connection.
	if err := feed(`{"id":1,"error":{"code":109,"message":"token expired"}}`); err == nil || !strings.Contains(err.Error(), "109") {
		t.Fatalf("refused connect: %v", err)
	}
	// Garbage is counted, not fatal.
	if err := feed("not json"); err != nil {
		t.Fatalf("bad message: %v", err)
	}
}
