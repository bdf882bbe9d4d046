package presence_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// timed records one user's transitions, from any number of instances, with
// their times.
type timed struct {
	mu     sync.Mutex
	online []bool
	at     []time.Time
}

func (r *timed) Online(_ context.Context, _ string, at time.Time) { r.add(true, at) }

func (r *timed) Offline(_ context.Context, _ string, at time.Time) { r.add(false, at) }

func (r *timed) add(online bool, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.online, r.at = append(r.online, online), append(r.at, at)
}

func (r *timed) count(online bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.online {
		if o == online {
			n++
		}
	}
	return n
}

// latest is the transition a client keeps when it orders them by their
// time: the one with the greatest, and whether another has the same time.
func (r *timed) latest() (online, tie bool, all string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := -1
	for i, at := range r.at {
		all += fmt.Sprintf(" %v@%d", r.online[i], at.UnixMilli())
		switch {
		case best < 0 || at.After(r.at[best]):
			best, tie = i, false
		case at.Equal(r.at[best]):
			tie = true
		}
	}
	return r.online[best], tie, all
}

// A user flapping across instances: the offline check of one instance
// runs after another instance's online transition, which came after that
// first instance's disconnect. The offline it reports must be later than
// that online one, or every client (they keep a user's latest transition
// by its time, transitions from different instances arriving in any
// order) drops it and shows the user online for good.
//
// A's connection ends (its check waits 1.5 s); C's check, due earlier,
// finds nobody and reports offline; D's connection then comes and goes
// (online again); A's check finds nobody and reports the user offline.
func TestOfflineAfterAnotherInstancesOnlineIsLater(t *testing.T) {
	ctx := context.Background()
	u := ids.New()
	rec := &timed{}
	a := newPresence(t, presence.Config{OfflineDebounce: 1500 * time.Millisecond}, rec)
	c := newPresence(t, presence.Config{OfflineDebounce: 200 * time.Millisecond}, rec)
	d := newPresence(t, presence.Config{OfflineDebounce: time.Hour}, rec)
	if err := c.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return rec.count(true) == 1 }, "no online transition")
	if _, err := c.Disconnect(ctx, u, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(ctx, presence.Conn{UserID: u, ConnID: "a1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Disconnect(ctx, u, "a1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return rec.count(false) == 1 }, "C reported no offline")
	if err := d.Connect(ctx, presence.Conn{UserID: u, ConnID: "d1"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := d.Disconnect(ctx, u, "d1"); err != nil {
		t.Fatal(err)
	}
	if rec.count(true) != 2 || rec.count(false) != 1 {
		_, _, all := rec.latest()
		t.Fatalf("A's check ran too early for the test: transitions%s", all)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return rec.count(false) == 2 }, "A reported no offline")
	if online, tie, all := rec.latest(); online || tie {
		t.Fatalf("the user has no connection, but its latest transition by time is online (or ambiguous):%s", all)
	}
}
