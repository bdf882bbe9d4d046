package presence_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
)

// Heartbeats are spread over the refresh interval: every connection is
// refreshed once per interval, but not all at the same instant (a burst of
// thousands of scripts would queue the Pub/Sub traffic sharing that Redis
// behind it).
func TestHeartbeatsSpreadOverTheInterval(t *testing.T) {
	ctx := context.Background()
	const interval = time.Second
	p := newPresence(t, presence.Config{RefreshInterval: interval, ConnTTL: 10 * time.Second}, nil)
	var conns []presence.Conn
	for i := range 200 {
		conns = append(conns, presence.Conn{UserID: ids.New(), ConnID: "c" + strconv.Itoa(i)})
	}
	p.Start(func() []presence.Conn { return conns })
	for _, c := range conns {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(interval * 17 / 10)
	rdb := client(t)
	now := time.Now().UnixMilli()
	lo, hi := int64(-1), int64(-1)
	for _, c := range conns {
		score, err := rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Result()
		if err != nil {
			t.Fatalf("connection %s: %v", c.ConnID, err)
		}
		s := int64(score)
		if age := now - s; age > int64(interval/time.Millisecond)*13/10+200 {
			t.Errorf("connection %s last refreshed %d ms ago, more than one interval", c.ConnID, age)
		}
		if lo < 0 || s < lo {
			lo = s
		}
		if s > hi {
			hi = s
		}
	}
	if spread := time.Duration(hi-lo) * time.Millisecond; spread < interval/2 {
		t.Fatalf("the last heartbeats of 200 connections lie within %v: refreshed in a burst, not spread over the %v interval", spread, interval)
	}
}

// Connect registers in one round trip; a connection over the per-user cap
// is refused and leaves nothing behind: no member in the user's set and no
// entry in the instance's index.
func TestConnectOverCapLeavesNoIndexEntry(t *testing.T) {
	ctx := context.Background()
	p := newPresence(t, presence.Config{MaxConnsPerUser: 2}, nil)
	u := ids.New()
	for _, id := range []string{"a", "b"} {
		if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c"}); !errors.Is(err, presence.ErrTooManyConnections) {
		t.Fatalf("third connection: %v, want ErrTooManyConnections", err)
	}
	rdb := client(t)
	members, err := rdb.ZRange(ctx, presence.InstanceConnsKey(p.Config().InstanceID), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{u + ":a", u + ":b"}; !slices.Equal(members, want) {
		t.Fatalf("instance index = %v, want %v", members, want)
	}
	if n, _ := rdb.ZCard(ctx, presence.UserConnsKey(u)).Result(); n != 2 {
		t.Fatalf("user's connections = %d, want 2", n)
	}
}
