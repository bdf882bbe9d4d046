package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/gateway"
)

// countedView serves in's handler through a listener that counts each
// accepted connection's writes, and returns a view of in whose clients
// connect there.
func countedView(t *testing.T, in *instance) (*instance, *writeCounter) {
	t.Helper()
	lc := &writeCounter{}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/realtime", in.svc.Handler())
	srv := httptest.NewUnstartedServer(mux)
	lc.Listener = srv.Listener
	srv.Listener = lc
	srv.Start()
	t.Cleanup(srv.Close)
	view := *in
	view.srv = srv
	return &view, lc
}

// writesOf is the number of writes on the only connection lc accepted.
func writesOf(t *testing.T, lc *writeCounter) int64 {
	t.Helper()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if len(lc.conns) != 1 {
		t.Fatalf("%d connections accepted, want 1", len(lc.conns))
	}
	return lc.conns[0].writes.Load()
}

// nextOf returns c's next frame, skipping the presence.changed frames of
// self: a socket's own transition may come back to it.
func nextOf(t *testing.T, c *client, self string) frame {
	t.Helper()
	for {
		f := c.next(10 * time.Second)
		if f.Type == "event" && f.Event == gateway.EventPresenceChanged {
			if u, _ := presenceOf(t, f); u == self {
				continue
			}
		}
		return f
	}
}

// presenceOf decodes a presence.changed frame's user and state.
func presenceOf(t *testing.T, f frame) (string, bool) {
	t.Helper()
	if f.Type != "event" || f.Event != gateway.EventPresenceChanged {
		t.Fatalf("got %s, want a presence.changed event", f.raw)
	}
	var d struct {
		UserID     string `json:"userId"`
		Online     bool   `json:"online"`
		LastSeenAt *int64 `json:"lastSeenAt"`
		ChangedAt  int64  `json:"changedAt"`
	}
	if err := json.Unmarshal(f.Data, &d); err != nil {
		t.Fatal(err)
	}
	// changedAt is when the transition happened (Redis's clock, which is
	// this machine's): what a client orders one user's transitions by.
	if at := time.UnixMilli(d.ChangedAt); time.Since(at) > time.Minute || time.Until(at) > time.Second {
		t.Fatalf("presence.changed at %v, not the transition's time: %s", at, f.raw)
	}
	if !d.Online && (d.LastSeenAt == nil || *d.LastSeenAt != d.ChangedAt) {
		t.Fatalf("an offline transition's changedAt is its lastSeenAt: %s", f.raw)
	}
	return d.UserID, d.Online
}

// presenceRig is an instance with the given presence delay, n users in one
// dialog, and the first of them (the watcher) connected through a listener
// that counts its writes, and subscribed.
type presenceRig struct {
	in      *instance
	lc      *writeCounter
	users   []string
	dialog  string
	watcher *client
}

func newPresenceRig(t *testing.T, delay time.Duration, n int) *presenceRig {
	t.Helper()
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) { c.PresenceDelay = delay }})
	view, lc := countedView(t, in)
	r := &presenceRig{in: in, lc: lc, users: in.users(n)}
	r.dialog = in.dialog(r.users...)
	r.watcher = view.connect(r.users[0])
	r.watcher.subscribe(r.dialog)
	return r
}

// Users coming online one after another within the presence delay reach a
// member's socket as a few writes, not one each, and every transition
// arrives once.
func TestPresenceFramesShareWrites(t *testing.T) {
	r := newPresenceRig(t, time.Second, 7)
	in, lc, users, watcher := r.in, r.lc, r.users, r.watcher
	before := writesOf(t, lc)

	// The other six connect at once (and stay).
	tokens := make([]string, len(users))
	for i, u := range users {
		tokens[i] = token(t, u)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(users))
	for _, tok := range tokens[1:] {
		wg.Go(func() {
			ws, _, err := in.dialRaw(dialOpts{token: tok})
			if err != nil {
				errs <- err
				return
			}
			t.Cleanup(func() { ws.CloseNow() })
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("dial: %v", err)
	}
	// Each transition is published on its own after its handshake, so
	// they may arrive in any order.
	want := map[string]bool{}
	for _, u := range users[1:] {
		want[u] = true
	}
	for range users[1:] {
		u, online := presenceOf(t, nextOf(t, watcher, users[0]))
		if !want[u] || !online {
			t.Fatalf("presence of %s online %v: not one of the users coming online, or twice", u, online)
		}
		delete(want, u)
	}
	// Six transitions published at once: at most two writes (a scan of
	// the hub may fall between them); one each without the delay.
	if n := writesOf(t, lc) - before; n > 2 {
		t.Fatalf("six presence frames took %d writes, want at most 2", n)
	}
}

// Any other frame takes the presence frames waiting before it along, in
// the same write.
func TestPresenceFramesLeaveWithTheNextFrame(t *testing.T) {
	r := newPresenceRig(t, time.Second, 7)
	in, lc, users, dialog, watcher := r.in, r.lc, r.users, r.dialog, r.watcher

	// Each attempt: a user comes online, and a message is posted once its
	// transition has had 100 ms to reach the watcher's queue. A scan of
	// the hub (once a second) may still fall between the two, so at least
	// one of six attempts must share the write; a writer that left the
	// presence frame for the scan never does.
	shared := false
	for _, u := range users[1:] {
		before := writesOf(t, lc)
		in.connect(u)
		time.Sleep(100 * time.Millisecond)
		msg := in.post(u, dialog, "hi")
		sawPresence, sawMessage := false, false
		for range 2 {
			f := nextOf(t, watcher, users[0])
			if f.Type == "event" && f.Event == "message.created" && f.Seq == msg.Seq {
				sawMessage = true
				continue
			}
			if who, online := presenceOf(t, f); who != u || !online {
				t.Fatalf("presence of %s online %v, want %s online", who, online, u)
			}
			sawPresence = true
		}
		if !sawPresence || !sawMessage {
			t.Fatalf("presence %v, message %v: want both", sawPresence, sawMessage)
		}
		if writesOf(t, lc)-before == 1 {
			shared = true
			break
		}
	}
	if !shared {
		t.Fatal("a message never took the waiting presence frame along in its write")
	}
}

// With the delay off, each presence frame is written when it comes:
// transitions 100 ms apart take a write each (with the delay they would
// wait for the hub's scan together).
func TestPresenceDelayOff(t *testing.T) {
	r := newPresenceRig(t, -1, 4)
	in, lc, users, watcher := r.in, r.lc, r.users, r.watcher
	// The watcher's own transition, if it comes back after the subscribe,
	// is written before the count starts.
	time.Sleep(300 * time.Millisecond)
	before := writesOf(t, lc)
	for _, u := range users[1:] {
		in.connect(u)
		if who, online := presenceOf(t, nextOf(t, watcher, users[0])); who != u || !online {
			t.Fatalf("presence of %s online %v, want %s online", who, online, u)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := writesOf(t, lc) - before; n < 3 {
		t.Fatalf("three presence frames took %d writes, want one each", n)
	}
}
