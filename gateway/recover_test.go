package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// recovered is what a subscribe with sinceSeq brought: the events before
// subscribed, a resync for the dialog if any, and subscribed itself.
type recovered struct {
	events []frame
	resync *frame
	sub    frame
}

// subscribeSince subscribes with sinceSeq and reads up to the subscribed
// frame. Any frame but message.created events of the dialog (and the
// resync naming it) fails the test.
func (c *client) subscribeSince(dialogID string, since int64) recovered {
	c.t.Helper()
	c.send(fmt.Sprintf(`{"type":"subscribe","dialogId":"%s","sinceSeq":%d}`, dialogID, since))
	return c.recoveryAnswer(dialogID)
}

// recoveryAnswer reads the answer to a subscribe with sinceSeq sent
// already: the replayed events or the resync, then subscribed.
func (c *client) recoveryAnswer(dialogID string) recovered {
	c.t.Helper()
	var r recovered
	for {
		f := c.next(20 * time.Second)
		switch {
		case f.Type == "event" && (f.Event == gateway.EventPresenceChanged || f.Event == gateway.EventTyping):
		case f.Type == "event" && f.Event == pubsub.EventMessageCreated && f.DialogID == dialogID && r.resync == nil:
			r.events = append(r.events, f)
		case f.Type == "resync" && r.resync == nil && len(r.events) == 0:
			r.resync = &f
		case f.Type == "subscribed" && f.DialogID == dialogID:
			r.sub = f
			return r
		default:
			c.t.Fatalf("unexpected frame during recovery: %s", f.raw)
		}
	}
}

// seqs are the seqs of message.created events.
func seqs(fs []frame) []int64 {
	out := make([]int64, len(fs))
	for i, f := range fs {
		out[i] = f.Seq
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// nextCreated returns the next message.created event (skipping presence
// and typing).
func (c *client) nextCreated() frame {
	c.t.Helper()
	f := c.expect("event")
	for f.Event != pubsub.EventMessageCreated {
		f = c.expect("event")
	}
	return f
}

// A client that reconnects with the last seq it saw gets exactly the
// events it missed, in order, as the very bytes a live subscriber got,
// then subscribed (recovered), then live events — nothing twice.
func TestRecoverReplaysMissedEvents(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	watcher := in.connect(u[0])
	watcher.subscribe(d)

	first := in.connect(u[1])
	first.subscribe(d)
	for i := 1; i <= 2; i++ {
		in.post(u[0], d, fmt.Sprint("before ", i))
		if f := first.nextCreated(); f.Seq != int64(i) {
			t.Fatalf("live seq %d, want %d", f.Seq, i)
		}
	}
	first.ws.CloseNow()
	<-first.done

	live := map[int64][]byte{}
	for i := 1; i <= 5; i++ {
		in.post(u[0], d, fmt.Sprint("missed ", i))
	}
	for i := 0; i < 7; i++ {
		f := watcher.nextCreated()
		live[f.Seq] = f.raw
	}

	again := in.connect(u[1])
	r := again.subscribeSince(d, 2)
	if r.resync != nil || r.sub.Recovered == nil || !*r.sub.Recovered || r.sub.LastSeq != 7 {
		t.Fatalf("subscribed %s (resync %v), want recovered true lastSeq 7", r.sub.raw, r.resync)
	}
	if got := seqs(r.events); fmt.Sprint(got) != fmt.Sprint(seqRange(3, 7)) {
		t.Fatalf("recovered seqs %v, want 3..7", got)
	}
	for _, f := range r.events {
		if string(f.raw) != string(live[f.Seq]) {
			t.Fatalf("seq %d recovered as %s, published as %s", f.Seq, f.raw, live[f.Seq])
		}
	}
	in.post(u[0], d, "live")
	if f := again.nextCreated(); f.Seq != 8 {
		t.Fatalf("live after recovery: seq %d, want 8", f.Seq)
	}

	// Nothing missed: recovered with no events.
	third := in.connect(u[1])
	if r := third.subscribeSince(d, 8); len(r.events) != 0 || r.resync != nil || !*r.sub.Recovered || r.sub.LastSeq != 8 {
		t.Fatalf("up to date: %d events, resync %v, subscribed %s", len(r.events), r.resync, r.sub.raw)
	}
	// Without sinceSeq the answer is unchanged: no recovered field.
	plain := in.connect(u[1])
	plain.send(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := plain.expect("subscribed"); string(f.raw) != `{"type":"subscribed","dialogId":"`+d+`","lastSeq":8}` {
		t.Fatalf("subscribe without sinceSeq answered %s", f.raw)
	}
	// sinceSeq on a dialog the connection is subscribed to already: the
	// client reconciles that dialog (a replay would interleave with live).
	if r := plain.subscribeSince(d, 3); r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable ||
		r.resync.DialogID != d || *r.sub.Recovered {
		t.Fatalf("resubscribe with sinceSeq: resync %v subscribed %s", r.resync, r.sub.raw)
	}
}

// Exactly once and in order across recovery and live while messages keep
// being sent: every client sees since+1 … last once each, whichever side
// of the recovery read a publish lands on. Run with a read that lingers
// (later subscribers join it) and with one that does not.
func TestRecoverExactlyOnceWhilePublishing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		linger time.Duration
	}{{"joins a lingering read", 5 * time.Second}, {"one read each", time.Nanosecond}} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstance(t, openPool(t), opts{
				hub: func(c *gateway.Config) {
					c.RecoverLinger, c.RecoverMax, c.UserHandshakeBurst = tc.linger, 1000, 100
				},
				presence: func(c *presence.Config) { c.MaxConnsPerUser = 100 },
			})
			u := in.users(2)
			d := in.dialog(u[0], u[1])
			for i := 0; i < 5; i++ {
				in.post(u[0], d, "seed")
			}
			const total = 60
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // one sender: publishes in seq order
				defer wg.Done()
				for i := 0; i < total; i++ {
					in.post(u[0], d, fmt.Sprint("m", i))
					if i%10 == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
				close(stop)
			}()
			const last = 5 + total
			var clients []*client
			var sinces []int64
			var got [][]int64
			for i := 0; i < 12; i++ {
				c := in.connect(u[1])
				seq, err := in.store.DialogLastSeq(context.Background(), d, u[1])
				if err != nil {
					t.Fatal(err)
				}
				since := max(seq-int64(i%4), 0)
				r := c.subscribeSince(d, since)
				if r.resync != nil || !*r.sub.Recovered {
					t.Fatalf("client %d: not recovered: %s", i, r.sub.raw)
				}
				clients, sinces, got = append(clients, c), append(sinces, since), append(got, seqs(r.events))
			}
			<-stop
			wg.Wait()
			for i, c := range clients {
				for len(got[i]) == 0 || got[i][len(got[i])-1] < last {
					got[i] = append(got[i], c.nextCreated().Seq)
				}
				if want := seqRange(sinces[i]+1, last); fmt.Sprint(got[i]) != fmt.Sprint(want) {
					t.Fatalf("client %d since %d saw %v, want %v", i, sinces[i], got[i], want)
				}
			}
			// Nothing more arrives (no late duplicate).
			in.post(u[0], d, "end")
			for i, c := range clients {
				if f := c.nextCreated(); f.Seq != last+1 {
					t.Fatalf("client %d: after the run got seq %d, want %d", i, f.Seq, last+1)
				}
			}
		})
	}
}

// Beyond HAN_WS_RECOVER_MAX events, RecoverBytes of frames, or
// HAN_WS_RECOVER_WINDOW of age, the client gets a resync naming the
// dialog, then subscribed recovered=false, then live events.
func TestRecoverLimitsResync(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverMax, c.RecoverBytes, c.RecoverLinger = 3, 3000, time.Nanosecond
	}})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	for i := 0; i < 5; i++ {
		in.post(u[0], d, "short")
	}
	expectResync := func(name string, since, lastSeq int64) {
		t.Helper()
		c := in.connect(u[1])
		r := c.subscribeSince(d, since)
		if r.resync == nil || string(r.resync.raw) != `{"type":"resync","reason":"recovery_unavailable","dialogId":"`+d+`"}` {
			t.Fatalf("%s: want a resync for the dialog, got events %v resync %v", name, seqs(r.events), r.resync)
		}
		if want := fmt.Sprintf(`{"type":"subscribed","dialogId":"%s","lastSeq":%d,"recovered":false}`, d, lastSeq); string(r.sub.raw) != want {
			t.Fatalf("%s: subscribed %s, want %s", name, r.sub.raw, want)
		}
		in.post(u[0], d, "live")
		if f := c.nextCreated(); f.Seq != lastSeq+1 {
			t.Fatalf("%s: live seq %d after the resync, want %d", name, f.Seq, lastSeq+1)
		}
	}
	expectRecovered := func(name string, since int64, want []int64) {
		t.Helper()
		c := in.connect(u[1])
		r := c.subscribeSince(d, since)
		if r.resync != nil || !*r.sub.Recovered || fmt.Sprint(seqs(r.events)) != fmt.Sprint(want) {
			t.Fatalf("%s: got %v resync %v subscribed %s, want %v recovered", name, seqs(r.events), r.resync, r.sub.raw, want)
		}
	}
	expectRecovered("max events exactly", 2, seqRange(3, 5))
	expectResync("more than max events", 1, 5) // 4 missed; live 6

	// Bytes: frames of 900-byte bodies are about 1,400 bytes each; three
	// exceed 3,000 bytes, two do not.
	big := strings.Repeat("x", 900)
	for i := 0; i < 3; i++ {
		in.post(u[0], d, big) // 7, 8, 9
	}
	expectRecovered("bytes within", 7, seqRange(8, 9))
	expectResync("bytes beyond", 6, 9) // live 10

	// Window: the outbox rows of 9 and 10 written 11 minutes ago.
	if _, err := in.pool.Exec(context.Background(), `UPDATE outbox SET created_at = now() - interval '11 minutes'
		WHERE message_id IN (SELECT id FROM messages WHERE dialog_id = $1 AND seq IN (9, 10))`, d); err != nil {
		t.Fatal(err)
	}
	expectRecovered("younger than the window", 10, nil)
	expectResync("older than the window", 9, 10) // live 11
	expectRecovered("after the old ones", 10, seqRange(11, 11))
}

// A reconnect storm: 1,000 sockets subscribing to one dialog with the same
// sinceSeq at once cost one recovery read, and each gets the missed events.
func TestRecoverStormOneRead(t *testing.T) {
	storm(t, 1000, []int64{1}, 1)
}

// Subscribes with different sinceSeq share reads too: a read starts from
// the lowest sinceSeq waiting for it, so two values cost at most two.
func TestRecoverStormLowestSince(t *testing.T) {
	storm(t, 200, []int64{3, 1}, 2)
}

// storm connects n sockets of one user, sends each a subscribe with
// sinceSeq since[i % len(since)] to a dialog of 4 messages at once, checks
// every answer and that at most maxReads recovery reads were made.
func storm(t *testing.T, n int, since []int64, maxReads uint64) {
	in := newInstance(t, openPool(t), opts{
		hub:      func(c *gateway.Config) { c.RecoverLinger, c.UserHandshakeBurst = 30*time.Second, 2000 },
		presence: func(c *presence.Config) { c.MaxConnsPerUser = 2000 },
	})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	for i := 0; i < 4; i++ {
		in.post(u[0], d, "missed")
	}
	clients := make([]*client, n)
	tok := token(t, u[1])
	for from := 0; from < n; from += 100 {
		batch := clients[from:min(from+100, n)]
		for i := range batch {
			batch[i] = in.connectWith(dialOpts{token: tok})
		}
		for i := range batch {
			batch[i] = helloOrRetry(t, in, batch[i], tok)
		}
	}
	before := in.svc.Stats().RecoverReads
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			frame := fmt.Sprintf(`{"type":"subscribe","dialogId":"%s","sinceSeq":%d}`, d, since[i%len(since)])
			if err := c.ws.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
				errs <- err.Error()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	for i, c := range clients {
		r := c.collectUntilSubscribed(d)
		if r.resync != nil || !*r.sub.Recovered || fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(since[i%len(since)]+1, 4)) {
			t.Fatalf("client %d: %v resync %v subscribed %s", i, seqs(r.events), r.resync, r.sub.raw)
		}
	}
	if reads := in.svc.Stats().RecoverReads - before; reads < 1 || reads > maxReads {
		t.Fatalf("%d concurrent subscribes made %d recovery reads, want 1 to %d", n, reads, maxReads)
	}
}

// helloOrRetry waits for c's hello; a connection the busy machine refused
// with 1013 is dialed again after a pause, as a client would.
func helloOrRetry(t *testing.T, in *instance, c *client, tok string) *client {
	t.Helper()
	for attempt := 0; ; attempt++ {
		select {
		case f := <-c.frames:
			if f.Type != "hello" {
				t.Fatalf("first frame %s", f.raw)
			}
			return c
		case <-c.done:
			if code, _ := c.closeStatus(time.Second); code != websocket.StatusTryAgainLater || attempt == 5 {
				t.Fatalf("connection ended: %v", c.err)
			}
			time.Sleep(time.Duration(100<<attempt) * time.Millisecond)
			c = in.connectWith(dialOpts{token: tok})
		case <-time.After(20 * time.Second):
			t.Fatal("no hello")
		}
	}
}

// collectUntilSubscribed reads what subscribeSince reads, for a subscribe
// already sent.
func (c *client) collectUntilSubscribed(dialogID string) recovered {
	c.t.Helper()
	var r recovered
	for {
		f := c.next(30 * time.Second)
		switch {
		case f.Type == "event" && f.Event == pubsub.EventMessageCreated && f.DialogID == dialogID && r.resync == nil:
			r.events = append(r.events, f)
		case f.Type == "event":
		case f.Type == "resync" && r.resync == nil && len(r.events) == 0:
			r.resync = &f
		case f.Type == "subscribed" && f.DialogID == dialogID:
			r.sub = f
			return r
		default:
			c.t.Fatalf("unexpected frame during recovery: %s", f.raw)
		}
	}
}

// A sinceSeq does not get around membership, and a sinceSeq that is not
// an integer ≥ 0 makes the frame invalid (the connection stays usable).
func TestRecoverRefusals(t *testing.T) {
	in := newInstance(t, openPool(t), opts{})
	u := in.users(3)
	d := in.dialog(u[0], u[1])
	for i := 0; i < 3; i++ {
		in.post(u[0], d, "private")
	}
	outsider := in.connect(u[2])
	outsider.send(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":0}`)
	if f := outsider.expect("error"); string(f.raw) != `{"type":"error","error":"dialog_not_found"}` {
		t.Fatalf("non-member with sinceSeq answered %s", f.raw)
	}
	in.post(u[0], d, "still private")
	outsider.send(`{"type":"ping"}`)
	outsider.expect("pong") // no event of the dialog came before

	c := in.connect(u[1])
	for _, v := range []string{`-1`, `"3"`, `1.5`, `1e2`, `null`, `true`, `99999999999999999999`, `{}`} {
		c.sendRaw(`{"type":"subscribe","dialogId":"` + d + `","sinceSeq":` + v + `}`)
		if f := c.expect("error"); string(f.raw) != `{"type":"error","error":"invalid_frame"}` {
			t.Fatalf("sinceSeq %s answered %s", v, f.raw)
		}
	}
	if r := c.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(1, 4)) || !*r.sub.Recovered {
		t.Fatalf("after the refusals: %v %s", seqs(r.events), r.sub.raw)
	}
}

// A read serves later subscribes for RecoverLinger: a subscriber that
// comes after messages were sent past the read's snapshot still gets
// them, in order, from the events the instance kept beside the read, and
// no second read is made.
func TestRecoverLingeringReadServesLaterSubscribes(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.RecoverLinger = time.Minute }})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "1")
	in.post(u[0], d, "2")
	before := in.svc.Stats().RecoverReads
	a := in.connect(u[1])
	if r := a.subscribeSince(d, 1); fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(2, 2)) || r.sub.LastSeq != 2 {
		t.Fatalf("first: %v %s", seqs(r.events), r.sub.raw)
	}
	in.post(u[0], d, "3")
	in.post(u[0], d, "4")
	for want := int64(3); want <= 4; want++ {
		if f := a.nextCreated(); f.Seq != want {
			t.Fatalf("live %d, want %d", f.Seq, want)
		}
	}
	b := in.connect(u[1])
	r := b.subscribeSince(d, 1)
	if fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(2, 4)) || !*r.sub.Recovered || r.sub.LastSeq != 4 {
		t.Fatalf("later subscriber: %v %s", seqs(r.events), r.sub.raw)
	}
	if reads := in.svc.Stats().RecoverReads - before; reads != 1 {
		t.Fatalf("%d reads, want 1", reads)
	}
	in.post(u[0], d, "5")
	if f := b.nextCreated(); f.Seq != 5 {
		t.Fatalf("live after: %d", f.Seq)
	}
	// A lower sinceSeq than the read's needs a read of its own.
	c := in.connect(u[1])
	if r := c.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(1, 5)) {
		t.Fatalf("lower since: %v", seqs(r.events))
	}
	if reads := in.svc.Stats().RecoverReads - before; reads != 2 {
		t.Fatalf("%d reads, want 2", reads)
	}
}

// After the Pub/Sub link was down, a lingering read no longer serves new
// subscribes (the events it kept may lack what was published meanwhile):
// the next subscribe reads again.
func TestRecoverReadAfterPubSubReconnect(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.RecoverLinger = time.Minute }})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "1")
	before := in.svc.Stats().RecoverReads
	a := in.connect(u[1])
	a.subscribeSince(d, 0)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.Do(context.Background(), "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	for f := a.next(10 * time.Second); f.Type != "resync"; f = a.next(10 * time.Second) {
	}
	in.post(u[0], d, "2")
	b := in.connect(u[1])
	if r := b.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(1, 2)) || !*r.sub.Recovered {
		t.Fatalf("after the reconnect: %v %s", seqs(r.events), r.sub.raw)
	}
	if reads := in.svc.Stats().RecoverReads - before; reads != 2 {
		t.Fatalf("%d reads, want 2 (one before the link dropped, one after)", reads)
	}
}

// A subscribe whose sinceSeq is beyond the dialog's last seq (a seq of
// another dialog, a stale cache) cannot be recovered: it gets a resync for
// the dialog and recovered:false, also when it comes while another
// socket's recovery read of the dialog serves later subscribes on the
// instance, and the dialog's later messages reach it.
func TestJoinedRecoveryPastLastSeqIsAResync(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.RecoverLinger = time.Minute }})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "1")
	in.post(u[0], d, "2")

	a := in.connect(u[1])
	if r := a.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != fmt.Sprint(seqRange(1, 2)) || !*r.sub.Recovered {
		t.Fatalf("first subscriber: %v %s", seqs(r.events), r.sub.raw)
	}
	// a's read serves b's subscribe (it lingers for a minute).
	b := in.connect(u[1])
	r := b.subscribeSince(d, 1000)
	if r.resync == nil || r.resync.DialogID != d || len(r.events) != 0 ||
		string(r.sub.raw) != fmt.Sprintf(`{"type":"subscribed","dialogId":"%s","lastSeq":2,"recovered":false}`, d) {
		t.Fatalf("sinceSeq 1000 of a dialog at seq 2: events %v, resync %v, subscribed %s; want a resync and recovered false",
			seqs(r.events), r.resync, r.sub.raw)
	}

	in.post(u[0], d, "3")
	if f := a.nextCreated(); f.Seq != 3 {
		t.Fatalf("first subscriber: seq %d, want 3", f.Seq)
	}
	// The instance writes the event to a and b one after the other, so b's
	// may come after a's: wait for it, then make sure nothing else follows
	// (the ping's pong comes after anything already written to b).
	if f := b.nextCreated(); f.Seq != 3 {
		t.Fatalf("after a resync for sinceSeq 1000: seq %d, want 3", f.Seq)
	}
	b.send(`{"type":"ping"}`)
	for f := b.next(10 * time.Second); f.Type != "pong"; f = b.next(10 * time.Second) {
		if f.Type == "event" && f.Event == pubsub.EventMessageCreated {
			t.Fatalf("after a resync for sinceSeq 1000: message %d came after message 3", f.Seq)
		}
	}
}

// A subscribe that comes while another socket's recovery read of the
// dialog serves later subscribes gets the answer a read of its own gives,
// also when its sinceSeq is a seq of the dialog that read does not know
// yet (a message committed after it whose event has not reached the
// instance): recovered, with the dialog's lastSeq.
func TestJoinedRecoveryIsAnsweredAsItsOwnRead(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{hub: func(c *gateway.Config) { c.RecoverLinger = time.Minute }})
	other := newInstance(t, pool, opts{})
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "1")
	in.post(u[0], d, "2")

	a := in.connect(u[1])
	a.subscribeSince(d, 0)
	in.post(u[0], d, "3") // kept beside a's read
	if f := a.nextCreated(); f.Seq != 3 {
		t.Fatalf("first subscriber: seq %d, want 3", f.Seq)
	}
	// Message 4 is committed, and its event not published (the outbox
	// relay would, much later).
	if _, _, _, err := in.store.SendMessage(context.Background(), store.SendMessage{ID: ids.New(), DialogID: d,
		SenderID: u[0], Body: "4", Event: true}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"type":"subscribed","dialogId":"%s","lastSeq":4,"recovered":true}`, d)
	if r := other.connect(u[1]).subscribeSince(d, 4); r.resync != nil || len(r.events) != 0 || string(r.sub.raw) != want {
		t.Fatalf("its own read: events %v, resync %v, subscribed %s; want %s", seqs(r.events), r.resync, r.sub.raw, want)
	}
	b := in.connect(u[1])
	if r := b.subscribeSince(d, 4); r.resync != nil || len(r.events) != 0 || string(r.sub.raw) != want {
		t.Fatalf("joined: events %v, resync %v, subscribed %s; want %s", seqs(r.events), r.resync, r.sub.raw, want)
	}
	in.post(u[0], d, "5")
	if f := b.nextCreated(); f.Seq != 5 {
		t.Fatalf("after the recovery: seq %d, want 5", f.Seq)
	}
}
