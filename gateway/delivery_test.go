package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/testenv"
)

func asCloseError(err error, ce *websocket.CloseError) bool { return errors.As(err, ce) }

// A on instance 1, B on instance 2, one dialog: A's message sent on
// instance 1 reaches B on instance 2 as an event frame whose JSON has exactly
// the fields of the realtime protocol's event frame and whose data is the
// stored message. (That the data equals the REST answer of the send is
// checked end to end in cmd/han-gateway.)
func TestCrossInstanceDelivery(t *testing.T) {
	pool := openPool(t)
	one := newInstance(t, pool, opts{})
	two := newInstance(t, pool, opts{})
	u := one.users(2)
	a, b := u[0], u[1]
	d := one.dialog(a, b)

	ca := one.connect(a)
	cb := two.connect(b)
	if ca.hello.Instance != one.id || cb.hello.Instance != two.id || cb.hello.ConnectionID == "" || cb.hello.HeartbeatMs <= 0 {
		t.Fatalf("hello frames: %s / %s", ca.hello.raw, cb.hello.raw)
	}
	if got := ca.subscribe(d); got != 0 {
		t.Fatalf("lastSeq of an empty dialog: %d", got)
	}
	cb.subscribe(d)

	m := one.post(a, d, "hello from instance 1")
	f := cb.expect("event")
	if f.Event != "message.created" || f.Seq != m.Seq || f.EntityID != m.ID || f.DialogID != d || f.Channel != "dialog:"+d || f.ID == "" {
		t.Fatalf("event frame: %s", f.raw)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(f.raw, &fields); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if fmt.Sprint(keys) != "[channel data dialogId entityId event id seq type]" {
		t.Fatalf("event frame fields: %v", keys)
	}
	var data messageDTO
	if err := json.Unmarshal(f.Data, &data); err != nil || data != m {
		t.Fatalf("event data %s, stored %+v", f.Data, m)
	}
	// The sender's socket on instance 1 gets the same bytes (encoded once,
	// forwarded as is).
	if fa := ca.expect("event"); !bytes.Equal(fa.raw, f.raw) {
		t.Fatalf("instance 1 forwarded %s, instance 2 %s", fa.raw, f.raw)
	}
}

// The Pub/Sub link is killed while 20 messages are sent: the subscribed
// sockets get resync, reconciliation with afterSeq returns all 20 and
// PostgreSQL holds all 20.
func TestPubSubLinkKilledResync(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	c := in.connect(u[1])
	last := c.subscribe(d)

	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			in.post(u[0], d, fmt.Sprintf("m%d", i))
		}
	}()
	// Kill the link while the posts are in flight (and again, in case the
	// first kill landed before the first post).
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int64
		_ = pool.QueryRow(context.Background(), "SELECT last_seq FROM dialogs WHERE id=$1", d).Scan(&n)
		return n >= 5
	}, "posts did not start")
	if err := admin.Do(context.Background(), "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	sawResync := false
	seen := map[int64]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for !sawResync && time.Now().Before(deadline) {
		f := c.next(10 * time.Second)
		switch {
		case f.Type == "resync":
			sawResync = f.Reason == "pubsub_reconnect"
		case f.Type == "event" && f.Event == "message.created":
			seen[f.Seq] = true
		}
	}
	if !sawResync {
		t.Fatal("no resync after the Pub/Sub link was killed")
	}
	got := in.history(d, last)
	if len(got) != 20 {
		t.Fatalf("reconciliation returned %d messages, want 20", len(got))
	}
	for i, m := range got {
		if m.Seq != last+int64(i)+1 {
			t.Fatalf("gap in reconciliation at %d: seq %d", i, m.Seq)
		}
	}
	var n int
	_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM messages WHERE dialog_id=$1", d).Scan(&n)
	if n != 20 {
		t.Fatalf("PostgreSQL holds %d messages, want 20", n)
	}
	// And the link works again.
	testenv.Eventually(t, 10*time.Second, in.svc.PubSubHealthy, "pubsub link did not recover")
	m := in.post(u[0], d, "after")
	for {
		f := c.next(10 * time.Second)
		if f.Type == "event" && f.Seq == m.Seq {
			break
		}
	}
}

// Messages posted while a subscribe is in flight are either delivered as
// events or covered by lastSeq: never silently missed.
func TestSubscribeRaceNeverMisses(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(2)
	for round := 0; round < 5; round++ {
		d := in.dialog(u[0], u[1])
		c := in.connect(u[1])
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				in.post(u[0], d, "x")
			}
		}()
		// Let some posts land first, then subscribe while they continue.
		testenv.Eventually(t, 10*time.Second, func() bool {
			var n int64
			_ = pool.QueryRow(context.Background(), "SELECT last_seq FROM dialogs WHERE id=$1", d).Scan(&n)
			return n >= 3
		}, "posts did not start")
		c.send(`{"type":"subscribe","dialogId":"` + d + `"}`)
		var lastSeq int64 = -1
		got := map[int64]bool{}
		for lastSeq < 0 {
			f := c.next(10 * time.Second)
			switch f.Type {
			case "subscribed":
				lastSeq = f.LastSeq
			case "event":
				t.Fatalf("an event arrived before the subscribed frame: %s", f.raw)
			}
		}
		// Keep posting a little after the subscription, then stop.
		testenv.Eventually(t, 10*time.Second, func() bool {
			var n int64
			_ = pool.QueryRow(context.Background(), "SELECT last_seq FROM dialogs WHERE id=$1", d).Scan(&n)
			return n >= lastSeq+3
		}, "posts did not continue")
		close(stop)
		wg.Wait()
		var final int64
		_ = pool.QueryRow(context.Background(), "SELECT last_seq FROM dialogs WHERE id=$1", d).Scan(&final)
		deadline := time.After(10 * time.Second)
		for seq := lastSeq + 1; seq <= final; {
			select {
			case f := <-c.frames:
				if f.Type == "event" && f.Event == "message.created" {
					got[f.Seq] = true
					for got[seq] {
						seq++
					}
				}
			case <-deadline:
				t.Fatalf("round %d: seq %d neither delivered nor covered by lastSeq %d", round, seq, lastSeq)
			}
		}
		for seq := int64(1); seq <= final; seq++ {
			if seq > lastSeq && !got[seq] {
				t.Fatalf("round %d: seq %d neither delivered nor covered by lastSeq %d", round, seq, lastSeq)
			}
		}
		c.ws.Close(websocket.StatusNormalClosure, "")
	}
}
