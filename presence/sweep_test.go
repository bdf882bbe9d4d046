package presence_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// An instance found dead may only have paused (a long GC, a stalled host)
// and come back while a survivor sweeps it: it sets its marker again and
// registers every connection anew. The sweep must not remove what it
// registered — those users would read as offline, get an offline
// transition and be missing from the per-user cap until the next periodic
// heartbeat, and the index entries it lost would leave their connections
// behind should the instance die for good later. A connection the
// instance did not register again is still removed.
func TestSweepSparesAnInstanceThatCameBack(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	const liveness = 4 * time.Second // registrations younger than 2 s are fresh
	cfg := func(name string) presence.Config {
		return presence.Config{InstanceID: name + "-" + ids.New()[24:], LivenessTTL: liveness,
			OfflineDebounce: 10 * time.Millisecond, SweepBatch: 7}
	}
	rec := &recorder{}
	sweeper := newPresence(t, cfg("sweeper"), rec)
	connect := func(p *presence.Presence, n int) []presence.Conn {
		var conns []presence.Conn
		for i := 0; i < n; i++ {
			c := presence.Conn{UserID: ids.New(), ConnID: fmt.Sprint("c", i)}
			if err := p.Connect(ctx, c); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		return conns
	}
	registered := func(id string, c presence.Conn) error {
		if rdb.Exists(ctx, presence.ConnKey(c.UserID, c.ConnID)).Val() != 1 {
			return fmt.Errorf("connection %s of %s: its HASH is gone", c.ConnID, c.UserID)
		}
		if err := rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err(); err != nil {
			return fmt.Errorf("connection %s of %s: not in the user's set (%v)", c.ConnID, c.UserID, err)
		}
		if err := rdb.ZScore(ctx, presence.InstanceConnsKey(id), c.UserID+":"+c.ConnID).Err(); err != nil {
			return fmt.Errorf("connection %s of %s: not in the instance's index (%v)", c.ConnID, c.UserID, err)
		}
		return nil
	}

	// Two instances stop heartbeating; the one that comes back later
	// registers its connections again between the sweep's disconnects and
	// its index removal; the other stays dead.
	lateCfg, deadCfg := cfg("late"), cfg("dead")
	late, dead := newPresence(t, lateCfg, nil), newPresence(t, deadCfg, nil)
	lateConns, deadConns := connect(late, 20), connect(dead, 20)
	time.Sleep(liveness/2 + 100*time.Millisecond)

	// The third comes back before the sweep reads its index: its
	// registrations are fresh.
	backCfg := cfg("back")
	back := newPresence(t, backCfg, nil)
	backConns := connect(back, 20)
	n, done, err := sweeper.SweepInstance(ctx, backCfg.InstanceID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || done {
		t.Fatalf("the sweep removed %d fresh registrations (done %v)", n, done)
	}
	for _, c := range backConns {
		if err := registered(backCfg.InstanceID, c); err != nil {
			t.Fatal(err)
		}
	}

	n, done, err = sweeper.SweepInstance(ctx, lateCfg.InstanceID, func() {
		if err := late.Refresh(ctx, lateConns); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the sweep of the late instance disconnected %d before it came back (done %v)", n, done)
	if done {
		t.Fatal("the late instance's index was swept empty after it registered its connections again")
	}
	for _, c := range lateConns {
		if err := registered(lateCfg.InstanceID, c); err != nil {
			t.Fatal(err)
		}
	}

	// Its marker (set by its last registrations) has expired.
	if err := rdb.Del(ctx, presence.InstanceKey(deadCfg.InstanceID)).Err(); err != nil {
		t.Fatal(err)
	}
	n, done, err = sweeper.SweepInstance(ctx, deadCfg.InstanceID, nil)
	if err != nil || !done || n != len(deadConns) {
		t.Fatalf("the dead instance's sweep: %d removed, done %v, %v", n, done, err)
	}
	for _, c := range deadConns {
		if rdb.Exists(ctx, presence.ConnKey(c.UserID, c.ConnID)).Val() != 0 ||
			rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() != redis.Nil {
			t.Fatalf("connection %v of the dead instance survived the sweep", c)
		}
	}

	// Offline transitions: every user of the dead instance, nobody else.
	alive := map[string]bool{}
	for _, c := range append(lateConns, backConns...) {
		alive["-"+c.UserID] = true
	}
	want := map[string]bool{}
	for _, c := range deadConns {
		want["-"+c.UserID] = true
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := 0
		for _, e := range rec.list() {
			if alive[e] {
				t.Fatalf("user %s was reported offline while its instance held its connection", e[1:])
			}
			if want[e] {
				got++
			}
		}
		if got == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d offline transitions of the dead instance's users", got, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a late check of a live user would show here
	for _, e := range rec.list() {
		if alive[e] {
			t.Fatalf("user %s was reported offline while its instance held its connection", e[1:])
		}
	}
}

// An instance that comes back while a survivor sweeps it sets its marker
// first and only then registers its connections again, a chunk at a time:
// with tens of thousands of them that takes seconds. The sweep in progress
// must stop once the marker is back, not go on removing (and announcing
// offline) every connection the instance has not registered again yet:
// their sockets are open on it.
func TestSweepStopsOnceTheInstanceIsBack(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	const liveness = 400 * time.Millisecond
	cfg := func(name string) presence.Config {
		return presence.Config{InstanceID: name + "-" + ids.New()[24:], LivenessTTL: liveness,
			OfflineDebounce: 10 * time.Millisecond, SweepBatch: 7}
	}
	rec := &recorder{}
	sweeper := newPresence(t, cfg("sweeper"), rec)
	slowCfg := cfg("slow")
	slow := newPresence(t, slowCfg, nil)
	var conns []presence.Conn
	for i := 0; i < 30; i++ {
		c := presence.Conn{UserID: ids.New(), ConnID: fmt.Sprint("c", i)}
		if err := slow.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(liveness/2 + 100*time.Millisecond) // its registrations are no longer fresh
	// Its marker has expired: a survivor found it dead.
	if err := rdb.Del(ctx, presence.InstanceKey(slowCfg.InstanceID)).Err(); err != nil {
		t.Fatal(err)
	}
	back := false
	n, done, err := sweeper.SweepInstance(ctx, slowCfg.InstanceID, func() {
		if !back {
			back = true
			if _, err := slow.RefreshLiveness(ctx); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, c := range conns {
		if rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() == nil {
			left++
		}
	}
	if done || n > 7 || left < len(conns)-7 {
		t.Fatalf("the sweep went on after the instance was back: %d of %d connections removed (done %v), %d left",
			n, len(conns), done, left)
	}
	if rdb.ZCard(ctx, presence.InstanceConnsKey(slowCfg.InstanceID)).Val() != int64(left) {
		t.Fatal("the index no longer lists the connections the sweep left")
	}
}

// An instance whose marker lapsed (a pause, a cut link) and whose
// connections survivors swept registers every connection anew at its next
// liveness refresh — also when a connect (or a heartbeat) reached Redis
// first and set the marker again: that one finds the marker gone, and the
// liveness refresh, finding it back, used to conclude nothing had lapsed,
// leaving the swept connections unregistered (their users offline) until
// their periodic heartbeat.
func TestConnectionsComeBackWhenAConnectFindsTheMarkerGone(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	const liveness = 3 * time.Second // refreshed every second; registrations younger than 1.5 s are fresh
	id := "lapse-" + ids.New()[24:]
	var mu sync.Mutex
	var conns []presence.Conn
	p := newPresence(t, presence.Config{InstanceID: id, LivenessTTL: liveness, RefreshInterval: time.Hour}, nil)
	p.Start(func() []presence.Conn {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(conns)
	})
	for i := range 5 {
		c := presence.Conn{UserID: ids.New(), ConnID: fmt.Sprint("c", i)}
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	time.Sleep(liveness/2 + 200*time.Millisecond) // no longer fresh: a sweep removes them
	sweeper := newPresence(t, presence.Config{InstanceID: "sweeper-" + ids.New()[24:], LivenessTTL: liveness}, nil)
	// Right after a liveness refresh (the marker's TTL back at its full
	// length), so the next one comes a second later: the lapse, the sweep
	// and the connect below happen between two refreshes.
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rdb.PTTL(ctx, presence.InstanceKey(id)).Val() > liveness-50*time.Millisecond
	}, "no liveness refresh seen")
	rdb.Del(ctx, presence.InstanceKey(id)) // the marker lapsed
	if n, _, err := sweeper.SweepInstance(ctx, id, nil); err != nil || n != 5 {
		t.Fatalf("sweep removed %d (%v), want the 5 connections", n, err)
	}
	late := presence.Conn{UserID: ids.New(), ConnID: "late"}
	if err := p.Connect(ctx, late); err != nil { // reaches Redis before the liveness refresh
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*liveness, func() bool {
		for _, c := range conns {
			if rdb.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() != nil {
				return false
			}
		}
		return true
	}, "the swept connections were not registered again")
}

// A survivor that takes a dead instance's sweep lock and then dies or
// stalls in the middle of the sweep holds the other survivors back only
// for about one sweep: the lock lives as long as one sweep may run, so
// another survivor takes the instance over and its users go offline
// within liveness TTL + sweep interval (+ the debounce) and a sweep more,
// not after the 30 s of the other coordination locks. Both users are
// announced: the one the stalled sweep removed (its offline check waited
// in the stalled survivor's memory) and the one it never reached.
func TestASweeperStalledWithTheLockHoldsOthersBackForOneSweep(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	deadID := "dead-" + ids.New()[24:]
	dead := newPresence(t, presence.Config{InstanceID: deadID, LivenessTTL: 300 * time.Millisecond}, rec)
	users := []string{ids.New(), ids.New()}
	for _, u := range users {
		if err := dead.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dead.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	testenv.Eventually(t, 5*time.Second, func() bool { return rdb.Exists(ctx, presence.InstanceKey(deadID)).Val() == 0 },
		"the dead instance's marker never expired")

	// The first survivor sweeps one connection per batch and stalls after
	// its first batch's disconnect, holding the lock; its own offline
	// checks would wait a minute.
	stalled := newPresence(t, presence.Config{LivenessTTL: 300 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		SweepBatch: 1, OfflineDebounce: time.Minute}, rec)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stalled.SetAfterSweepDisconnect(func() {
		once.Do(func() {
			close(reached)
			<-release
		})
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = stalled.Sweep(ctx)
	}()
	t.Cleanup(func() {
		close(release)
		<-done
	})
	<-reached

	s := newPresence(t, presence.Config{LivenessTTL: 300 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		OfflineDebounce: 100 * time.Millisecond}, rec)
	s.Start(func() []presence.Conn { return nil })
	testenv.Eventually(t, 10*time.Second, func() bool {
		got := rec.list()
		return slices.Contains(got, "-"+users[0]) && slices.Contains(got, "-"+users[1])
	}, "the dead instance's users were not announced offline while a stalled sweeper held its lock: %v", rec.list())
}
