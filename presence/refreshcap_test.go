package presence_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
)

// refusals collects what presence hands to Config.Refused.
type refusals struct {
	mu    sync.Mutex
	conns []presence.Conn
}

func (r *refusals) add(conns []presence.Conn) {
	r.mu.Lock()
	r.conns = append(r.conns, conns...)
	r.mu.Unlock()
}

func (r *refusals) reset() {
	r.mu.Lock()
	r.conns = nil
	r.mu.Unlock()
}

func (r *refusals) list() []presence.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.conns)
}

// liveConns counts the user's members whose heartbeat is within the
// connection TTL (90 s), as the cap does.
func liveConns(t *testing.T, rdb redis.UniversalClient, user string) int64 {
	t.Helper()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	cut := strconv.FormatInt(now.Add(-90*time.Second).UnixMilli(), 10)
	n, err := rdb.ZCount(ctx, presence.UserConnsKey(user), cut, "+inf").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// An instance that was only paused (a long GC, a frozen VM) may come back
// after survivors swept its connections and after their user opened up to
// the cap elsewhere. Its refresh registers those connections again only
// within the cap: the ones over it are refused, left out of its index and
// handed to Config.Refused (the gateway closes their sockets), so the user
// never holds more live connections than the cap.
func TestRefreshOfASweptConnectionKeepsTheCap(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	const liveness = time.Second // registrations younger than 0.5 s are fresh
	refused := &refusals{}
	pausedCfg := presence.Config{InstanceID: "paused-" + ids.New()[24:], LivenessTTL: liveness, Refused: refused.add}
	paused := newPresence(t, pausedCfg, nil)
	survivor := newPresence(t, presence.Config{InstanceID: "survivor-" + ids.New()[24:], LivenessTTL: liveness}, nil)
	u := ids.New()
	var held []presence.Conn
	for i := range 4 {
		c := presence.Conn{UserID: u, ConnID: fmt.Sprint("paused-", i)}
		if err := paused.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}

	// The pause: the marker expires and a survivor sweeps the instance.
	time.Sleep(liveness/2 + 100*time.Millisecond)
	if err := rdb.Del(ctx, presence.InstanceKey(pausedCfg.InstanceID)).Err(); err != nil {
		t.Fatal(err)
	}
	if n, done, err := survivor.SweepInstance(ctx, pausedCfg.InstanceID, nil); err != nil || !done || n != len(held) {
		t.Fatalf("the sweep of the paused instance: %d removed, done %v, %v", n, done, err)
	}
	// Meanwhile the user reconnects elsewhere, up to the cap.
	for i := range 16 {
		if err := survivor.Connect(ctx, presence.Conn{UserID: u, ConnID: fmt.Sprint("survivor-", i)}); err != nil {
			t.Fatalf("connection %d on the survivor: %v", i, err)
		}
	}

	// The paused instance comes back and refreshes what it still holds.
	if err := paused.Refresh(ctx, held); err != nil {
		t.Fatal(err)
	}
	if n := liveConns(t, rdb, u); n != 16 {
		t.Fatalf("the user has %d live connections after the paused instance came back, want the cap (16)", n)
	}
	for _, c := range held {
		if rdb.Exists(ctx, presence.ConnKey(u, c.ConnID)).Val() != 0 || rdb.ZScore(ctx, presence.UserConnsKey(u), c.ConnID).Err() != redis.Nil {
			t.Fatalf("the refused connection %s was registered", c.ConnID)
		}
		if rdb.ZScore(ctx, presence.InstanceConnsKey(pausedCfg.InstanceID), u+":"+c.ConnID).Err() != redis.Nil {
			t.Fatalf("the refused connection %s is listed in its instance's index", c.ConnID)
		}
	}
	if got := refused.list(); !slices.Equal(got, held) {
		t.Fatalf("refused connections handed over: %v, want %v", got, held)
	}

	// A slot freed: the next refresh registers one of them again, and
	// refuses the rest.
	if _, err := survivor.Disconnect(ctx, u, "survivor-0"); err != nil {
		t.Fatal(err)
	}
	refused.reset()
	if err := paused.Refresh(ctx, held); err != nil {
		t.Fatal(err)
	}
	if n := liveConns(t, rdb, u); n != 16 {
		t.Fatalf("the user has %d live connections after a slot freed, want 16", n)
	}
	if got := refused.list(); len(got) != len(held)-1 {
		t.Fatalf("after a slot freed the refresh refused %v, want all but one of %v", got, held)
	}
}

// The refresh of connections that are registered is never refused, even
// for a user at the cap: it is their heartbeat.
func TestRefreshAtTheCapIsNeverRefused(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	refused := &refusals{}
	cfg := presence.Config{InstanceID: "i-" + ids.New()[24:], MaxConnsPerUser: 4, Refused: refused.add}
	p := newPresence(t, cfg, nil)
	u := ids.New()
	var conns []presence.Conn
	for i := range 4 {
		c := presence.Conn{UserID: u, ConnID: fmt.Sprint("c", i), Subscriptions: i}
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	before := rdb.ZRangeWithScores(ctx, presence.UserConnsKey(u), 0, -1).Val()
	time.Sleep(20 * time.Millisecond)
	for i := range conns {
		conns[i].Subscriptions += 10
	}
	if err := p.Refresh(ctx, conns); err != nil {
		t.Fatal(err)
	}
	if got := refused.list(); len(got) != 0 {
		t.Fatalf("the refresh of registered connections at the cap refused %v", got)
	}
	after := rdb.ZRangeWithScores(ctx, presence.UserConnsKey(u), 0, -1).Val()
	if len(after) != 4 {
		t.Fatalf("members after the refresh: %v", after)
	}
	for i, z := range after {
		if z.Score <= before[i].Score {
			t.Fatalf("member %v was not refreshed (before %v)", z, before[i])
		}
	}
	for _, c := range conns {
		if rdb.HGet(ctx, presence.ConnKey(u, c.ConnID), "subscriptions_count").Val() != fmt.Sprint(c.Subscriptions) {
			t.Fatalf("connection %s's HASH was not refreshed", c.ConnID)
		}
	}
}
