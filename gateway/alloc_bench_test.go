package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// BenchmarkDeliveryAllocs measures what one delivered event allocates on
// the real path: events published into the dialogs' Redis channels, the
// gateway's Pub/Sub subscriber, Hub.Dispatch, the connection queues and
// writers, real sockets over loopback to coder/websocket clients in this
// process. One op is one delivery (one event on one socket), so -benchmem's
// allocs/op and B/op are per delivery; gc/1M-deliveries is the number of
// GC cycles the process ran per million deliveries.
//
// Everything around the gateway is kept from allocating, so that the
// figures are the gateway's: the publisher writes pre-encoded PUBLISH
// commands on a raw connection and reads the replies into a fixed buffer,
// and the clients read every frame into one reused buffer instead of a new
// slice.
//
// Two shapes: every client in one dialog (large batches per writer), and
// ten dialogs of ten clients with publishes rotating over them (small
// batches, as in a chat load where each dialog has few members online).
func BenchmarkDeliveryAllocs(b *testing.B) {
	for _, shape := range []struct {
		name             string
		dialogs, members int
	}{
		{"1dialog_100clients", 1, 100},
		{"10dialogs_10clients", 10, 10},
	} {
		b.Run(shape.name, func(b *testing.B) {
			benchDeliveryAllocs(b, shape.dialogs, shape.members)
		})
	}
}

func benchDeliveryAllocs(b *testing.B, dialogs, members int) {
	b.ReportAllocs()
	in := newInstance(b, openPool(b), opts{})
	payloads := make([][]byte, dialogs) // one pipelined window of PUBLISH commands per dialog
	clients := make([][]*discardCounter, dialogs)
	for d := range dialogs {
		users := in.users(members)
		dialog := in.dialog(users...)
		clients[d] = dialDiscardCounters(b, in, users, dialog)
		msg := pubsub.Message{ID: ids.New(), DialogID: dialog, Seq: 1, SenderID: users[0],
			Body: strings.Repeat("x", 100), CreatedAt: time.Now().UnixMilli(), Attachments: []pubsub.Attachment{}}
		data, err := json.Marshal(msg)
		if err != nil {
			b.Fatal(err)
		}
		ev, err := pubsub.NewDialogEvent(ids.New(), pubsub.EventMessageCreated, msg.ID, dialog, msg.Seq, data).Encode()
		if err != nil {
			b.Fatal(err)
		}
		payloads[d] = respPublish(pubsub.DialogChannel(dialog), ev)
	}
	pub := dialRawPublisher(b)

	// Windows of windowEvents publishes per dialog; the next window starts
	// when every client has the previous one, so no queue overflows into a
	// resync.
	const windowEvents = 10
	events := max(1, (b.N+members-1)/members)
	sent := make([]int64, dialogs)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for done, d := 0, 0; done < events; d = (d + 1) % dialogs {
		n := min(windowEvents, events-done)
		pub.publish(b, payloads[d], n)
		done += n
		sent[d] += int64(n)
		waitDiscardCounters(b, clients[d], sent[d])
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	deliveries := float64(events * members)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/deliveries, "allocs/delivery")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/deliveries, "B/delivery")
	b.ReportMetric(float64(after.NumGC-before.NumGC)*1e6/deliveries, "gc/1M-deliveries")
}

var messageCreatedEvent = []byte(`"event":"message.created"`)

// discardCounter is a benchmark client that counts the events it reads and
// keeps none.
type discardCounter struct {
	n atomic.Int64
}

func dialDiscardCounters(b *testing.B, in *instance, users []string, dialog string) []*discardCounter {
	out := make([]*discardCounter, 0, len(users))
	for _, u := range users {
		ws, _, err := in.dialRaw(dialOpts{token: token(b, u)})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if _, _, err := ws.Read(ctx); err != nil { // hello
			b.Fatal(err)
		}
		if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","dialogId":"`+dialog+`"}`)); err != nil {
			b.Fatal(err)
		}
		for {
			_, m, err := ws.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if strings.Contains(string(m), `"subscribed"`) {
				break
			}
		}
		dc := &discardCounter{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			// One buffer for every frame; only the benchmark's events
			// count (presence events of the other members may arrive too).
			var buf bytes.Buffer
			for {
				_, r, err := ws.Reader(context.Background())
				if err != nil {
					return
				}
				buf.Reset()
				if _, err := buf.ReadFrom(r); err != nil {
					return
				}
				if bytes.Contains(buf.Bytes(), messageCreatedEvent) {
					dc.n.Add(1)
				}
			}
		}()
		b.Cleanup(func() { ws.CloseNow(); <-done })
		out = append(out, dc)
	}
	return out
}

func waitDiscardCounters(b *testing.B, cs []*discardCounter, want int64) {
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range cs {
		for c.n.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("a client has %d of %d events", c.n.Load(), want)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// rawPublisher sends PUBLISH commands on a plain connection to the
// package's Redis, as api_backend, without allocating per command.
type rawPublisher struct {
	nc  net.Conn
	r   *bufio.Reader
	buf []byte
}

func dialRawPublisher(b *testing.B) *rawPublisher {
	nc, err := net.Dial("tcp", env.Redis.Addr())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	p := &rawPublisher{nc: nc, r: bufio.NewReader(nc)}
	if _, err := nc.Write(respCommand("AUTH", rds.APIBackendUser, env.Redis.Password)); err != nil {
		b.Fatal(err)
	}
	if line, err := p.r.ReadSlice('\n'); err != nil || string(line) != "+OK\r\n" {
		b.Fatalf("AUTH: %q %v", line, err)
	}
	return p
}

// publish sends cmd n times in one write and reads the n replies.
func (p *rawPublisher) publish(b *testing.B, cmd []byte, n int) {
	p.buf = p.buf[:0]
	for range n {
		p.buf = append(p.buf, cmd...)
	}
	if _, err := p.nc.Write(p.buf); err != nil {
		b.Fatal(err)
	}
	for range n {
		line, err := p.r.ReadSlice('\n')
		if err != nil || len(line) == 0 || line[0] != ':' {
			b.Fatalf("PUBLISH: %q %v", line, err)
		}
	}
}

func respPublish(channel string, payload []byte) []byte {
	return respCommand("PUBLISH", channel, string(payload))
}

func respCommand(args ...string) []byte {
	out := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		out = append(out, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	return out
}
