package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/wsschema"
)

// rtFrame is any server → client frame of the realtime protocol.
type rtFrame struct {
	Type      string          `json:"type"`
	Channel   string          `json:"channel"`
	ID        string          `json:"id"`
	Event     string          `json:"event"`
	EntityID  string          `json:"entityId"`
	DialogID  string          `json:"dialogId"`
	Seq       int64           `json:"seq"`
	Data      json.RawMessage `json:"data"`
	Instance  string          `json:"instance"`
	LastSeq   int64           `json:"lastSeq"`
	Reason    string          `json:"reason"`
	Recovered *bool           `json:"recovered"`

	raw []byte
}

// frameSchemas are the published frame shapes (docs/asyncapi.yaml): every
// frame a test client sends or receives is checked against them.
var frameSchemas = sync.OnceValues(func() (*wsschema.Validator, error) { return wsschema.Load("../../docs/schemas/ws") })

func validFrame(fromClient bool, b []byte) error {
	v, err := frameSchemas()
	if err != nil {
		return err
	}
	if fromClient {
		return v.Client(b)
	}
	return v.Server(b)
}

// rtClient is a real WebSocket client of a running program's
// /v1/realtime whose frames a goroutine reads into a channel.
type rtClient struct {
	t      *testing.T
	ws     *websocket.Conn
	frames chan rtFrame
	done   chan struct{}
	err    error // the read error that ended the client; valid after done
	hello  rtFrame
}

// dialRT opens a socket on m with a bearer token or a ticket (a browser's
// way: with origin) and starts reading; it waits for no frame.
func dialRT(t *testing.T, m *Main, bearer, ticket, origin string) *rtClient {
	t.Helper()
	h := http.Header{}
	if bearer != "" {
		h.Set("Authorization", "Bearer "+bearer)
	}
	if origin != "" {
		h.Set("Origin", origin)
	}
	u := "ws://" + m.Addr() + "/v1/realtime"
	if ticket != "" {
		u += "?ticket=" + ticket
	}
	return openRT(t, u, &websocket.DialOptions{Subprotocols: []string{gateway.Subprotocol}, HTTPHeader: h})
}

// openRT dials u with opts and starts reading; it waits for no frame.
func openRT(t *testing.T, u string, opts *websocket.DialOptions) *rtClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	ws.SetReadLimit(1 << 20)
	c := &rtClient{t: t, ws: ws, frames: make(chan rtFrame, 1024), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				c.err = err
				return
			}
			var f rtFrame
			if err := json.Unmarshal(b, &f); err != nil {
				c.err = fmt.Errorf("undecodable frame %q: %w", b, err)
				return
			}
			if err := validFrame(false, b); err != nil {
				c.t.Errorf("server frame does not match docs/schemas/ws: %v", err)
			}
			f.raw = b
			c.frames <- f
		}
	}()
	t.Cleanup(func() { c.ws.CloseNow(); <-c.done })
	return c
}

// connectRT dials m with a bearer token and waits for hello.
func connectRT(t *testing.T, m *Main, tok string) *rtClient {
	t.Helper()
	c := dialRT(t, m, tok, "", "")
	c.hello = c.expect("hello")
	return c
}

// next returns the next frame or fails after timeout.
func (c *rtClient) next(timeout time.Duration) rtFrame {
	c.t.Helper()
	select {
	case f := <-c.frames:
		return f
	case <-c.done:
		select {
		case f := <-c.frames:
			return f
		default:
		}
		c.t.Fatalf("connection ended: %v", c.err)
	case <-time.After(timeout):
		c.t.Fatalf("no frame within %v", timeout)
	}
	return rtFrame{}
}

// expect returns the next frame of type typ, skipping presence and typing
// events (which arrive whenever users come and go); any other frame fails
// the test.
func (c *rtClient) expect(typ string) rtFrame {
	c.t.Helper()
	for {
		f := c.next(10 * time.Second)
		if f.Type == "event" && (f.Event == gateway.EventPresenceChanged || f.Event == gateway.EventTyping) {
			continue
		}
		if f.Type == typ {
			return f
		}
		c.t.Fatalf("want a %s frame, got %s", typ, f.raw)
	}
}

// send writes a frame, first checked against its schema in docs/schemas/ws;
// sendRaw writes a deliberately invalid one.
func (c *rtClient) send(v string) {
	c.t.Helper()
	if err := validFrame(true, []byte(v)); err != nil {
		c.t.Fatalf("client frame does not match docs/schemas/ws: %v", err)
	}
	c.sendRaw(v)
}

func (c *rtClient) sendRaw(v string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(v)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// subscribe subscribes and returns the subscribed frame's lastSeq.
func (c *rtClient) subscribe(dialogID string) int64 {
	c.t.Helper()
	c.send(`{"type":"subscribe","dialogId":"` + dialogID + `"}`)
	f := c.expect("subscribed")
	if f.DialogID != dialogID {
		c.t.Fatalf("subscribed to %s, want %s", f.DialogID, dialogID)
	}
	return f.LastSeq
}

// closeStatus waits for the connection to end and returns the close code
// the server sent (-1 if none).
func (c *rtClient) closeStatus(timeout time.Duration) websocket.StatusCode {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.t.Fatalf("connection still open after %v", timeout)
	}
	var ce websocket.CloseError
	if errors.As(c.err, &ce) {
		return ce.Code
	}
	return -1
}

// restMessage is the REST answer of a message send (the fields the event
// frame's data carries too).
type restMessage struct {
	ID        string `json:"id"`
	DialogID  string `json:"dialogId"`
	Seq       int64  `json:"seq"`
	SenderID  string `json:"senderId"`
	Body      string `json:"body"`
	CreatedAt int64  `json:"createdAt"`
}

// restSend sends a message over m's REST API and returns its answer.
func restSend(t *testing.T, m *Main, tok, dialogID, body string) restMessage {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"body": body})
	code, resp := callH(t, "POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", tok, string(b),
		map[string]string{"Idempotency-Key": ids.New(), "Content-Type": "application/json"})
	if code != 201 {
		t.Fatalf("send: %d %s", code, resp)
	}
	var msg restMessage
	if err := json.Unmarshal([]byte(resp), &msg); err != nil {
		t.Fatal(err)
	}
	return msg
}

// restDialog creates, over m's REST API, a dialog of the token's user and
// members (every member seen first, as their first request does).
func restDialog(t *testing.T, m *Main, tok string, members ...string) string {
	t.Helper()
	for _, u := range members {
		if code, body := call(t, "GET", m.URL()+"/v1/me", userToken(t, u), ""); code != 200 {
			t.Fatalf("me: %d %s", code, body)
		}
	}
	ms, _ := json.Marshal(members)
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", tok, `{"memberIds":`+string(ms)+`}`)
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	return body[strings.Index(body, `"id":"`)+6:][:36]
}
