package presence_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// slowOffline records transitions with their times; its Offline takes a
// while, as the gateway's does (it writes last seen to PostgreSQL before
// it publishes).
type slowOffline struct {
	mu       sync.Mutex
	events   []string
	at       []time.Time
	entered  chan struct{}
	duration time.Duration
}

func (s *slowOffline) Online(_ context.Context, u string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events, s.at = append(s.events, "+"+u), append(s.at, at)
}

func (s *slowOffline) Offline(_ context.Context, u string, at time.Time) {
	s.entered <- struct{}{}
	time.Sleep(s.duration)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events, s.at = append(s.events, "-"+u), append(s.at, at)
}

func (s *slowOffline) list() ([]string, []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events), slices.Clone(s.at)
}

// A user who goes offline and comes straight back: the online transition
// must reach the user's dialogs after the offline one, or their members
// show the user offline while it is connected, until its next transition.
// Each transition also carries Redis's time, later for the later one, so
// transitions announced by different instances can be ordered too.
func TestTransitionsOfOneUserAreReportedInOrder(t *testing.T) {
	ctx := context.Background()
	ev := &slowOffline{entered: make(chan struct{}, 1), duration: 300 * time.Millisecond}
	p := newPresence(t, presence.Config{OfflineDebounce: 10 * time.Millisecond}, ev)
	u := ids.New()
	before := time.Now().Add(-time.Second)
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Disconnect(ctx, u, "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no offline transition")
	}
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "b"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { e, _ := ev.list(); return len(e) == 3 }, "transitions: %v", ev.events)
	events, at := ev.list()
	if want := []string{"+" + u, "-" + u, "+" + u}; !slices.Equal(events, want) {
		t.Fatalf("transitions reported %v, want %v", events, want)
	}
	if !at[0].After(before) || at[1].Before(at[0]) || !at[2].After(at[1]) {
		t.Fatalf("transition times out of order: %v", at)
	}
}
