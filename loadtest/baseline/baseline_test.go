package baseline_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/loadtest/baseline"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

func start(t *testing.T, cfg baseline.Config) *baseline.Server {
	t.Helper()
	s := baseline.New(cfg, nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func dial(t *testing.T, s *baseline.Server) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(context.Background(), "ws://"+s.Addr()+"/v1/realtime", &websocket.DialOptions{Subprotocols: []string{"han.v1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func read(t *testing.T, c *websocket.Conn) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

func send(t *testing.T, c *websocket.Conn, frame string) {
	t.Helper()
	if err := c.Write(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		t.Fatal(err)
	}
}

func TestProtocolHelloSubscribePublishPong(t *testing.T) {
	s := start(t, baseline.Config{InstanceID: "b1"})
	a, b := dial(t, s), dial(t, s)
	for _, c := range []*websocket.Conn{a, b} {
		if h := read(t, c); h["type"] != "hello" || h["instance"] != "b1" || h["connectionId"] == "" {
			t.Fatalf("hello = %v", h)
		}
	}
	send(t, a, `{"type":"subscribe","dialogId":"d1"}`)
	if m := read(t, a); m["type"] != "subscribed" || m["dialogId"] != "d1" {
		t.Fatalf("subscribed = %v", m)
	}
	frame := `{"type":"event","channel":"dialog:d1","id":"e1","event":"x","entityId":"e1","dialogId":"d1","seq":1,"data":{}}`
	resp, err := http.Post(s.URL()+"/publish?channel=han:rt:dialog:d1", "application/json", strings.NewReader(frame))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `{"subscribers":1}` {
		t.Fatalf("publish = %s", body)
	}
	// The subscriber gets the published bytes unchanged.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, got, err := a.Read(ctx)
	if err != nil || string(got) != frame {
		t.Fatalf("event = %s, %v", got, err)
	}
	// b did not subscribe: a ping is answered by the next frame it gets.
	send(t, b, `{"type":"ping"}`)
	if m := read(t, b); m["type"] != "pong" {
		t.Fatalf("b got %v, want pong (and no event)", m)
	}
	send(t, a, `{"type":"unsubscribe","dialogId":"d1"}`)
	send(t, a, `nonsense`)
	if m := read(t, a); m["type"] != "error" || m["error"] != "invalid_frame" {
		t.Fatalf("error frame = %v", m)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		r, err := http.Post(s.URL()+"/publish?channel=han:rt:dialog:d1", "application/json", strings.NewReader(frame))
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return string(b) == `{"subscribers":0}`
	}, "unsubscribe did not take effect")
	http.DefaultClient.CloseIdleConnections()
}

func TestPublishSocketAndDropSwitch(t *testing.T) {
	s := start(t, baseline.Config{DropEvery: 2})
	a := dial(t, s)
	read(t, a)
	send(t, a, `{"type":"subscribe","dialogId":"d"}`)
	read(t, a)
	p, _, err := websocket.Dial(context.Background(), "ws://"+s.Addr()+"/publish", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.CloseNow()
	for i := range 4 {
		if err := p.Write(context.Background(), websocket.MessageText, []byte("han:rt:dialog:d\n{\"n\":"+string(rune('0'+i))+"}")); err != nil {
			t.Fatal(err)
		}
	}
	// Every second delivery is dropped on purpose: 2 of 4 arrive.
	got := []string{}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, b, err := a.Read(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(b))
	}
	if got[0] != `{"n":0}` || got[1] != `{"n":2}` {
		t.Fatalf("got %v, want n=0 and n=2", got)
	}
	if st := s.ReadStats(); st.Deliveries != 2 || st.Connections != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestSlowConsumerIsDroppedWithoutBlockingFanOut(t *testing.T) {
	s := start(t, baseline.Config{QueueSize: 2})
	slow, fast := dial(t, s), dial(t, s)
	for _, c := range []*websocket.Conn{slow, fast} {
		read(t, c)
		send(t, c, `{"type":"subscribe","dialogId":"d"}`)
		read(t, c)
	}
	// slow never reads again; fast reads every frame before the next one.
	fast.SetReadLimit(1 << 20)
	big := []byte(`{"pad":"` + strings.Repeat("x", 60<<10) + `"}`)
	sent := 0
	for s.ReadStats().SlowClosed == 0 {
		if sent == 5000 {
			t.Fatal("the slow consumer was never dropped")
		}
		if n := s.Publish("han:rt:dialog:d", big); n == 0 {
			t.Fatal("publish reached nobody")
		}
		sent++
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _, err := fast.Read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("the fast consumer suffered from the slow one: %v", err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return s.Connections() == 1 }, "slow connection still counted")
	if n := s.Publish("han:rt:dialog:d", big); n != 1 {
		t.Fatalf("publish after the drop reached %d, want the fast consumer only", n)
	}
}

func TestMemstatsAndRequiredSubprotocol(t *testing.T) {
	s := start(t, baseline.Config{})
	resp, err := http.Get(s.URL() + "/debug/memstats")
	if err != nil {
		t.Fatal(err)
	}
	var st baseline.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if err != nil || !st.GCForced || st.HeapInuse == 0 || st.StackInuse == 0 || st.Goroutines == 0 {
		t.Fatalf("memstats = %+v, %v", st, err)
	}
	c, _, err := websocket.Dial(context.Background(), "ws://"+s.Addr()+"/v1/realtime", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	_, _, err = c.Read(context.Background())
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("without han.v1: %v, want a policy close", err)
	}
}
