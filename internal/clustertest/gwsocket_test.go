package clustertest_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/internal/wsschema"
	"github.com/han-app/gateway/pubsub"
)

// The realtime protocol's subprotocol (the gateway's Subprotocol).
const wsSubprotocol = "han.v1"

// frameSchemas are the published frame shapes: every frame a socket
// receives is checked against them.
var frameSchemas = sync.OnceValues(func() (*wsschema.Validator, error) { return wsschema.Load("../../docs/schemas/ws") })

// socket is a WebSocket client of one instance that records what it
// receives: the seqs of message.created events per dialog, resync frames,
// and the control frames (hello, subscribed) in order.
type socket struct {
	t    *testing.T
	name string // for failure messages: instance and dialog
	ws   *websocket.Conn
	done chan struct{}

	mu       sync.Mutex // guards the fields below
	err      error      // the read error that ended the socket
	seqs     map[string]map[int64]int
	resyncs  []string // raw resync frames
	control  []string // frame types other than event and resync, in order
	badFrame string   // the first frame that did not match its schema
}

// dialSocket connects a user's socket to g, waits for hello and
// subscribes it to dialogID.
func dialSocket(t *testing.T, g *gw, tok, dialogID string) *socket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	ws, _, err := websocket.Dial(ctx, "ws://"+g.addr+"/v1/realtime", &websocket.DialOptions{Subprotocols: []string{wsSubprotocol}, HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial %s: %v", g.name, err)
	}
	ws.SetReadLimit(1 << 20)
	s := &socket{t: t, name: g.name + "/" + dialogID[len(dialogID)-6:], ws: ws, done: make(chan struct{}), seqs: map[string]map[int64]int{}}
	go s.read()
	t.Cleanup(func() { s.ws.CloseNow(); <-s.done })
	s.waitControl(1, "hello")
	s.write(`{"type":"subscribe","dialogId":"` + dialogID + `"}`)
	s.waitControl(2, "subscribed")
	return s
}

func (s *socket) read() {
	defer close(s.done)
	v, verr := frameSchemas()
	for {
		_, b, err := s.ws.Read(context.Background())
		if err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return
		}
		var f struct {
			Type     string `json:"type"`
			Event    string `json:"event"`
			DialogID string `json:"dialogId"`
			Seq      int64  `json:"seq"`
		}
		derr := json.Unmarshal(b, &f)
		s.mu.Lock()
		switch {
		case derr != nil || verr != nil:
			s.badFrame = fmt.Sprintf("%s (%v %v)", b, derr, verr)
		case v.Server(b) != nil:
			if s.badFrame == "" {
				s.badFrame = fmt.Sprintf("%s: %v", b, v.Server(b))
			}
		case f.Type == "event" && f.Event == pubsub.EventMessageCreated:
			if s.seqs[f.DialogID] == nil {
				s.seqs[f.DialogID] = map[int64]int{}
			}
			s.seqs[f.DialogID][f.Seq]++
		case f.Type == "resync":
			s.resyncs = append(s.resyncs, string(b))
		case f.Type != "event":
			s.control = append(s.control, f.Type)
		}
		s.mu.Unlock()
	}
}

func (s *socket) write(frame string) {
	s.t.Helper()
	if v, err := frameSchemas(); err != nil || v.Client([]byte(frame)) != nil {
		s.t.Fatalf("client frame %s does not match its schema (%v)", frame, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.ws.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		s.t.Fatalf("%s: write: %v", s.name, err)
	}
}

// waitControl waits until the socket received n control frames, the
// last of type typ.
func (s *socket) waitControl(n int, typ string) {
	s.t.Helper()
	var got []string
	testenv.Eventually(s.t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		got = append(got[:0], s.control...)
		return len(s.control) >= n || s.err != nil
	}, "%s: no %s frame within 10s", s.name, typ)
	if len(got) < n || got[n-1] != typ {
		s.t.Fatalf("%s: control frames %v (ended: %v), want frame %d to be %s", s.name, got, s.err, n, typ)
	}
}

// has reports whether the socket received every seq of dialogID.
func (s *socket) has(dialogID string, seqs []int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range seqs {
		if s.seqs[dialogID][q] == 0 {
			return false
		}
	}
	return true
}

// missing lists the seqs of dialogID the socket did not receive.
func (s *socket) missing(dialogID string, seqs []int64) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, q := range seqs {
		if s.seqs[dialogID][q] == 0 {
			out = append(out, q)
		}
	}
	return out
}

// state returns the resync frames received, the error that ended the
// socket, and the first frame that broke its schema.
func (s *socket) state() (resyncs []string, ended error, bad string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.resyncs...), s.err, s.badFrame
}

// waitDelivered waits until every socket holds every seq of dialogID.
func waitDelivered(t *testing.T, socks []*socket, dialogID string, seqs []int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, s := range socks {
		for !s.has(dialogID, seqs) {
			if time.Now().After(deadline) {
				_, ended, _ := s.state()
				t.Fatalf("socket %s: seqs %v of dialog %s not delivered within %v (socket ended: %v)",
					s.name, s.missing(dialogID, seqs), dialogID, within, ended)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
