package gateway_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// rawClient is a hand-made WebSocket client on a socket with a small
// receive buffer, so that not reading fills the server's send path
// quickly instead of disappearing into loopback buffers.
type rawClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func (in *instance) rawConnect(userID string) *rawClient {
	in.t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	addr := strings.TrimPrefix(in.srv.URL, "http://")
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		in.t.Fatal(err)
	}
	in.t.Cleanup(func() { nc.Close() })
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(nc, "GET /v1/realtime HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\nAuthorization: Bearer %s\r\n\r\n",
		addr, base64.StdEncoding.EncodeToString(key), gateway.Subprotocol, token(in.t, userID))
	br := bufio.NewReaderSize(nc, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		in.t.Fatalf("raw handshake: %v %v", resp, err)
	}
	rc := &rawClient{t: in.t, nc: nc, br: br}
	if f := rc.read(); f.Type != "hello" {
		in.t.Fatalf("raw client: want hello, got %s", f.raw)
	}
	return rc
}

// write sends one masked text frame.
func (rc *rawClient) write(payload string) {
	rc.t.Helper()
	var hdr []byte
	hdr = append(hdr, 0x81)
	if n := len(payload); n < 126 {
		hdr = append(hdr, 0x80|byte(n))
	} else {
		hdr = append(hdr, 0x80|126, byte(n>>8), byte(n))
	}
	mask := []byte{1, 2, 3, 4}
	hdr = append(hdr, mask...)
	b := []byte(payload)
	for i := range b {
		b[i] ^= mask[i%4]
	}
	if _, err := rc.nc.Write(append(hdr, b...)); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one frame; a close frame comes back as type "close".
func (rc *rawClient) read() frame {
	rc.t.Helper()
	_ = rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(rc.br, h[:]); err != nil {
		rc.t.Fatalf("raw read: %v", err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		_, _ = io.ReadFull(rc.br, b[:])
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, _ = io.ReadFull(rc.br, b[:])
		n = binary.BigEndian.Uint64(b[:])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(rc.br, p); err != nil {
		rc.t.Fatalf("raw read: %v", err)
	}
	switch h[0] & 0x0f {
	case 0x8:
		return frame{Type: "close", raw: p}
	case 0x9, 0xa:
		return rc.read() // ping/pong: the server pings rarely; skip
	}
	var f frame
	if err := json.Unmarshal(p, &f); err != nil {
		rc.t.Fatalf("raw frame %q: %v", p, err)
	}
	f.raw = p
	return f
}

// readSkipPresence reads the next frame that is not a presence.changed
// event: the client's own online transition is published to its dialog
// after the connect, and whether it reaches the socket depends on whether
// the subscription is live by then (such a frame then rides along with the
// next frame written, even ahead of a subscribed reply).
func (rc *rawClient) readSkipPresence() frame {
	rc.t.Helper()
	for {
		if f := rc.read(); f.Type != "event" || f.Event != gateway.EventPresenceChanged {
			return f
		}
	}
}

// rawSubscriber starts an instance with these queue, write-timeout and
// send-buffer settings and one raw client (small receive buffer) of a
// one-member dialog, subscribed to it.
func rawSubscriber(t *testing.T, queueFrames int, writeTimeout time.Duration, sendBuffer int) (*instance, *rawClient, string) {
	t.Helper()
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.QueueFrames, c.WriteTimeout, c.SendBuffer = queueFrames, writeTimeout, sendBuffer
	}})
	users := in.users(1)
	d := in.dialog(users...)
	rc := in.rawConnect(users[0])
	rc.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := rc.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("%s", f.raw)
	}
	return in, rc, d
}

// event publishes a durable event of about size bytes straight into the
// dialog's Redis channel, as the exact JSON text of the event frame clients
// receive.
func publishEvent(t *testing.T, in *instance, dialogID string, seq int64, size int) string {
	t.Helper()
	id := ids.New()
	data, _ := json.Marshal(map[string]string{"pad": strings.Repeat("x", size)})
	payload, err := pubsub.NewDialogEvent(id, "message.created", ids.New(), dialogID, seq, data).Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := in.rt.Publish(context.Background(), pubsub.DialogChannel(dialogID), payload).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// A client that never reads does not slow delivery to 100 others: they get
// every event, its queue stays bounded (overflowing into one resync), and
// it is closed once it has accepted nothing for the write timeout.
func TestSlowConsumerNeverReading(t *testing.T) {
	const queue = 32
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) {
		c.QueueFrames, c.WriteTimeout, c.SendBuffer = queue, 5*time.Second, 32<<10
	}})
	users := in.users(101)
	d := in.dialog(users...)

	slow := in.rawConnect(users[0])
	slow.write(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := slow.readSkipPresence(); f.Type != "subscribed" {
		t.Fatalf("slow client: %s", f.raw)
	}
	// From here on the slow client never reads.

	readers := make([]*client, 100)
	var got []atomic.Int64
	got = make([]atomic.Int64, 100)
	var wg sync.WaitGroup
	for i := range readers {
		readers[i] = in.connect(users[i+1])
		readers[i].subscribe(d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case f := <-readers[i].frames:
					if f.Type == "event" && f.Event == "message.created" {
						got[i].Add(1)
					} else if f.Type == "resync" {
						t.Errorf("reader %d got resync: it is not slow", i)
					}
				case <-readers[i].done:
					return
				}
			}
		}()
	}

	const burst, size = 20, 2000
	published := int64(0)
	allGot := func() bool {
		for i := range got {
			if got[i].Load() < published {
				return false
			}
		}
		return true
	}
	// Publish in bursts, each delivered to all 100 readers before the
	// next, until the slow client's queue has overflowed and a few bursts
	// more (bounded).
	extra := 0
	for round := 0; round < 50 && extra < 3; round++ {
		for i := 0; i < burst; i++ {
			published++
			publishEvent(t, in, d, published, size)
		}
		testenv.Eventually(t, 20*time.Second, allGot, "readers did not get burst %d while a client is stuck", round)
		if st := in.svc.Stats(); st.QueueOverflows > 0 {
			extra++
		} else if st.Connections < 101 {
			t.Fatalf("the stuck client was closed before its queue overflowed: %+v", st)
		}
	}
	st := in.svc.Stats()
	if st.QueueOverflows == 0 {
		t.Fatalf("the never-reading client never overflowed after %d events: %+v", published, st)
	}
	if st.MaxQueueFrames > queue {
		t.Fatalf("a queue grew to %d frames, bound %d", st.MaxQueueFrames, queue)
	}
	// It is closed as a slow consumer and the 100 readers stay.
	testenv.Eventually(t, 20*time.Second, func() bool { return in.svc.Stats().Connections == 100 }, "the stuck client was not closed")
	if st := in.svc.Stats(); st.SlowConsumerCloses == 0 {
		t.Fatalf("slow consumer close not counted: %+v", st)
	}
	for i := range got {
		if n := got[i].Load(); n != published {
			t.Fatalf("reader %d got %d of %d events", i, n, published)
		}
	}
	for _, r := range readers {
		r.ws.CloseNow()
	}
	wg.Wait()
}

// A client that stops reading for a while gets its queued events replaced
// by one resync, stays connected, and receives new events after it.
func TestSlowConsumerGetsResync(t *testing.T) {
	in, rc, d := rawSubscriber(t, 16, 30*time.Second, 32<<10)
	seq := int64(0)
	for i := 0; i < 2000 && in.svc.Stats().QueueOverflows == 0; i++ {
		seq++
		publishEvent(t, in, d, seq, 2000)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return in.svc.Stats().QueueOverflows > 0 }, "no overflow")
	// Resume reading: events, then exactly one resync, then new events.
	resyncs := 0
	for {
		f := rc.read()
		if f.Type == "resync" {
			if f.Reason != "slow_consumer" {
				t.Fatalf("resync reason: %s", f.raw)
			}
			resyncs++
			break
		}
		if f.Type != "event" {
			t.Fatalf("unexpected frame %s", f.raw)
		}
	}
	last := publishEvent(t, in, d, seq+1, 10)
	for {
		f := rc.read()
		if f.Type == "resync" {
			resyncs++
		}
		if f.Type == "close" {
			t.Fatalf("closed: %q", f.raw)
		}
		if f.ID == last {
			break
		}
	}
	if resyncs != 1 {
		t.Fatalf("%d resync frames, want 1", resyncs)
	}
}
