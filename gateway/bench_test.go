package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// counter is a benchmark client: it counts frames and decodes nothing.
type counter struct {
	ws *websocket.Conn
	n  atomic.Int64
}

func countFrames(ctx context.Context, ws *websocket.Conn, c *counter) {
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			return
		}
		c.n.Add(1)
	}
}

// baselineServer is the minimal broadcast server on the same library and
// the same Redis: one Pub/Sub subscription, every message written to every
// socket in turn. No auth, presence, queues or protocol.
type baselineServer struct {
	mu    sync.Mutex
	conns []*websocket.Conn
	srv   *httptest.Server
}

func newBaseline(b *testing.B, rt redis.UniversalClient, channel string) *baselineServer {
	bs := &baselineServer{}
	bs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		bs.mu.Lock()
		bs.conns = append(bs.conns, ws)
		bs.mu.Unlock()
		<-ws.CloseRead(context.Background()).Done()
	}))
	b.Cleanup(bs.srv.Close)
	ps := rt.Subscribe(context.Background(), channel)
	if _, err := ps.Receive(context.Background()); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := ps.ReceiveMessage(context.Background())
			if err != nil {
				return
			}
			payload := []byte(msg.Payload)
			bs.mu.Lock()
			conns := bs.conns
			bs.mu.Unlock()
			for _, c := range conns {
				_ = c.Write(context.Background(), websocket.MessageText, payload)
			}
		}
	}()
	b.Cleanup(func() {
		ps.Close()
		<-done
		bs.mu.Lock()
		for _, c := range bs.conns {
			c.CloseNow()
		}
		bs.mu.Unlock()
	})
	return bs
}

// BenchmarkFanOut publishes events straight into a dialog's Redis channel
// and measures deliveries per second to 100 subscribed WebSocket clients,
// for the gateway and for the minimal baseline in the same run.
func BenchmarkFanOut(b *testing.B) {
	const clients = 100
	pool := openPool(b)
	pub, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pub.Close() })
	payloadFor := func(d string) string {
		p, _ := pubsub.NewDialogEvent(ids.New(), "message.created", ids.New(), d, 1,
			[]byte(`{"body":"`+strings.Repeat("x", 100)+`"}`)).Encode()
		return string(p)
	}
	// Events go out in windows of 100 (pipelined), and the next window
	// starts when every client has the previous one: in flight stays under
	// the queue bound, so no client falls behind into resync.
	run := func(b *testing.B, channel, payload string, cs []*counter) {
		ctx := context.Background()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; {
			pipe := pub.Pipeline()
			for j := 0; j < 100 && i < b.N; j++ {
				pipe.Publish(ctx, channel, payload)
				i++
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for _, c := range cs {
				for c.n.Load() < int64(i) {
					if time.Now().After(deadline) {
						b.Fatalf("a client has %d of %d events", c.n.Load(), i)
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
		}
		el := time.Since(start)
		b.ReportMetric(float64(clients*b.N)/el.Seconds(), "deliveries/s")
		for _, c := range cs {
			c.n.Store(0)
		}
	}

	b.Run("baseline", func(b *testing.B) {
		channel := pubsub.DialogChannel(ids.New())
		bs := newBaseline(b, pub, channel)
		cs := dialCounters(b, "ws"+strings.TrimPrefix(bs.srv.URL, "http"), nil, clients, nil)
		for {
			bs.mu.Lock()
			n := len(bs.conns)
			bs.mu.Unlock()
			if n == clients {
				break
			}
			time.Sleep(time.Millisecond)
		}
		run(b, channel, payloadFor(channel), cs)
	})
	b.Run("gateway", func(b *testing.B) {
		in := newInstance(b, pool, opts{})
		users := in.users(clients)
		d := in.dialog(users...)
		cs := dialCounters(b, in.wsURL(), users, clients, func(ws *websocket.Conn) {
			ctx := context.Background()
			_, _, _ = ws.Read(ctx) // hello
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+d+`"}`))
			for {
				_, m, err := ws.Read(ctx)
				if err != nil || strings.Contains(string(m), `"subscribed"`) {
					return
				}
			}
		})
		run(b, pubsub.DialogChannel(d), payloadFor(d), cs)
	})
}

func dialCounters(b *testing.B, url string, users []string, n int, setup func(*websocket.Conn)) []*counter {
	var cs []*counter
	for i := 0; i < n; i++ {
		h := http.Header{}
		if users != nil {
			h.Set("Authorization", "Bearer "+token(b, users[i]))
		}
		ws, _, err := websocket.Dial(context.Background(), url, &websocket.DialOptions{
			Subprotocols: []string{gateway.Subprotocol}, HTTPHeader: h})
		if err != nil {
			b.Fatal(err)
		}
		if setup != nil {
			setup(ws)
		}
		c := &counter{ws: ws}
		done := make(chan struct{})
		go func() {
			defer close(done)
			countFrames(context.Background(), ws, c)
		}()
		b.Cleanup(func() { ws.CloseNow(); <-done })
		cs = append(cs, c)
	}
	return cs
}
