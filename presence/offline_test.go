package presence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
)

// A socket that flaps (closes and comes back within the debounce, again
// and again) is not announced offline: the debounce runs from the last
// disconnect, not the first. The check the first disconnect scheduled
// falls due while the socket is closed a second time; only the last
// disconnect, with no comeback, is announced.
func TestOfflineDebounceRunsFromTheLastDisconnect(t *testing.T) {
	const debounce = 2 * time.Second
	for attempt := 1; ; attempt++ {
		got, ok := flapThenLeave(t, debounce)
		if !ok {
			// A gap outlasted the debounce (a stalled machine): that
			// run shows nothing either way, so it is run again.
			if attempt == 3 {
				t.Fatalf("in three runs a 1 s gap took longer than the %v debounce: the machine stalled, the rule was never shown", debounce)
			}
			continue
		}
		if len(got) != 2 || got[0][0] != '+' || got[1][0] != '-' {
			t.Fatalf("transitions %v: no gap lasted the %v debounce but the last, want one online and one offline", got, debounce)
		}
		return
	}
}

// flapThenLeave connects a user, then closes and reopens its socket twice
// (the second closing spans the time the first disconnect's check falls
// due), then closes it for good. It returns the transitions once the last
// check has run, and false when a gap between a disconnect and the next
// connect reached the debounce.
func flapThenLeave(t *testing.T, debounce time.Duration) ([]string, bool) {
	t.Helper()
	ctx := context.Background()
	rec := &recorder{}
	p := newPresence(t, presence.Config{OfflineDebounce: debounce}, rec)
	admin := client(t)
	u := ids.New()
	connect := func(id string) {
		t.Helper()
		if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: id}); err != nil {
			t.Fatal(err)
		}
	}
	disconnect := func(id string) {
		t.Helper()
		if _, err := p.Disconnect(ctx, u, id); err != nil {
			t.Fatal(err)
		}
	}
	connect("c1")
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 1 }, "no online transition")

	start := time.Now()
	disconnect("c1") // its check falls due at debounce
	time.Sleep(debounce / 2)
	connect("c2")
	gap1 := time.Since(start)
	time.Sleep(debounce * 3 / 10)
	closed := time.Now()
	disconnect("c2")
	time.Sleep(debounce * 4 / 10)
	connect("c3") // at 1.2 debounce
	gap2 := time.Since(closed)

	disconnect("c3") // for good
	testenv.Eventually(t, 10*time.Second, func() bool { return admin.Exists(ctx, presence.OnlineKey(u)).Val() == 0 },
		"the user was never reported offline")
	p.Close() // waits for the transitions in flight
	got := slices.DeleteFunc(rec.list(), func(e string) bool { return e[1:] != u })
	return got, gap1 < debounce && gap2 < debounce
}

// scriptFault fails pipelines that start with one of scripts: the next
// one once armed (Redis timing out or failing over at that moment), every
// one while down (Redis out for this instance).
type scriptFault struct {
	scripts []*lua.Script
	armed   atomic.Bool
	down    atomic.Bool
	// lose: the next one runs and its reply is lost (Redis ran the calls,
	// the caller never learns).
	lose atomic.Bool
}

func (f *scriptFault) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *scriptFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *scriptFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.matches(cmds) && f.lose.CompareAndSwap(true, false) {
			_ = next(ctx, cmds)
			err := errors.New("i/o timeout (injected, after the calls ran)")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		if f.matches(cmds) && (f.down.Load() || f.armed.CompareAndSwap(true, false)) {
			err := errors.New("i/o timeout (injected)")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

func (f *scriptFault) matches(cmds []redis.Cmder) bool {
	if len(cmds) == 0 || len(cmds[0].Args()) < 2 {
		return false
	}
	sha := fmt.Sprint(cmds[0].Args()[1])
	return slices.ContainsFunc(f.scripts, func(s *lua.Script) bool { return s.Hash() == sha })
}

// presenceWithFault is a Presence whose client fails pipelines of scripts
// as the returned fault says.
func presenceWithFault(t *testing.T, cfg presence.Config, ev presence.Events, scripts ...*lua.Script) (*presence.Presence, *scriptFault) {
	t.Helper()
	f := &scriptFault{scripts: scripts}
	rdb := client(t)
	rdb.AddHook(f)
	if cfg.InstanceID == "" {
		cfg.InstanceID = "i-" + ids.New()[24:]
	}
	p, err := presence.New(rdb, cfg, ev, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, f
}

// An offline check that fails (a Redis timeout or failover as it runs) is
// run again: the user is still announced offline once Redis answers.
func TestFailedOfflineCheckIsRetried(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p, fault := presenceWithFault(t, presence.Config{OfflineDebounce: 100 * time.Millisecond}, rec, lua.RTOffline)
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) }, "no online transition")
	fault.armed.Store(true)
	if _, err := p.Disconnect(ctx, u, "c1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return !fault.armed.Load() }, "the offline check never ran")
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Contains(rec.list(), "-"+u) },
		"the user was never announced offline after one failed check: %v", rec.list())
}

// A disconnect whose removal fails (Redis out for a moment) still ends in
// the offline transition once Redis answers, well before the connection
// would go stale (ConnTTL, 90 s): the removal is done again and the check
// follows it. The same holds for the removal of many connections at once.
// Should the removal not get through before the connection goes stale, the
// transition still goes out then.
func TestFailedDisconnectStillAnnouncesOffline(t *testing.T) {
	disconnect := func(ctx context.Context, p *presence.Presence, c presence.Conn) error {
		_, err := p.Disconnect(ctx, c.UserID, c.ConnID)
		return err
	}
	disconnectMany := func(ctx context.Context, p *presence.Presence, c presence.Conn) error {
		_, err := p.DisconnectMany(ctx, []presence.Conn{c})
		return err
	}
	for _, tc := range []struct {
		name       string
		connTTL    time.Duration
		down       bool // every removal fails, not only the first
		disconnect func(ctx context.Context, p *presence.Presence, c presence.Conn) error
	}{
		{"Disconnect", 0, false, disconnect},
		{"DisconnectMany", 0, false, disconnectMany},
		{"Disconnect until stale", 2 * time.Second, true, disconnect},
		{"DisconnectMany until stale", 2 * time.Second, true, disconnectMany},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rec := &recorder{}
			cfg := presence.Config{ConnTTL: tc.connTTL, OfflineDebounce: 100 * time.Millisecond}
			p, fault := presenceWithFault(t, cfg, rec, lua.RTDisconnect, lua.RTDisconnectUser)
			c := presence.Conn{UserID: ids.New(), ConnID: "c1"}
			if err := p.Connect(ctx, c); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+c.UserID) }, "no online transition")
			fault.armed.Store(true)
			fault.down.Store(tc.down)
			if err := tc.disconnect(ctx, p, c); err == nil {
				t.Fatal("the injected failure did not reach the caller")
			}
			testenv.Eventually(t, 20*time.Second, func() bool { return slices.Contains(rec.list(), "-"+c.UserID) },
				"the user was never announced offline after a failed removal: %v", rec.list())
			if n, err := p.Online(ctx, c.UserID); err != nil || n != 0 {
				t.Fatalf("live connections after the offline transition: %d %v", n, err)
			}
		})
	}
}

// scriptFailures counts the pipelines of script that failed.
type scriptFailures struct {
	script *lua.Script
	n      atomic.Int32
}

func (f *scriptFailures) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *scriptFailures) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *scriptFailures) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil && len(cmds) > 0 && len(cmds[0].Args()) > 1 && fmt.Sprint(cmds[0].Args()[1]) == f.script.Hash() {
			f.n.Add(1)
		}
		return err
	}
}

// Redis stalls (a long fork, a stopped process) while the offline check
// runs: the call gives up, Redis runs the check when it wakes and deletes
// the online marker, and the reply is lost. The check run again still
// reports the transition, so the user is announced offline.
func TestOfflineAnnouncedAfterAStalledCheck(t *testing.T) {
	ctx := context.Background()
	r, rdb := testenv.StallableRedis(t, 1, 200*time.Millisecond)
	failures := &scriptFailures{script: lua.RTOffline}
	rdb.AddHook(failures)
	rec := &recorder{}
	p, err := presence.New(rdb, presence.Config{InstanceID: "i-" + ids.New()[24:], OfflineDebounce: 300 * time.Millisecond},
		rec, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// As on a running service the script is loaded, so the stalled
	// EVALSHA runs when Redis wakes.
	if err := lua.RTOffline.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) }, "no online transition")
	if _, err := p.Disconnect(ctx, u, "c1"); err != nil {
		t.Fatal(err)
	}
	thaw := r.Freeze(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return failures.n.Load() > 0 }, "the offline check never gave up")
	thaw()
	testenv.Eventually(t, 10*time.Second, func() bool { return rdb.Exists(ctx, presence.OnlineKey(u)).Val() == 0 },
		"the online marker was never deleted")
	testenv.Eventually(t, 15*time.Second, func() bool { return slices.Contains(rec.list(), "-"+u) },
		"Redis deleted the online marker but the user was never announced offline: %v", rec.list())
}

// A graceful shutdown whose last removal failed (Redis blinked) leaves that
// connection to the survivors: Deregister takes only the liveness marker,
// so the index still lists the connection and a survivor's sweep removes it
// (and its user goes offline). Deleting the index too left the connection
// registered and the user online with nobody to sweep it.
func TestDeregisterLeavesAFailedRemovalToTheSurvivors(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	id := "dereg-" + ids.New()[24:]
	p, f := presenceWithFault(t, presence.Config{InstanceID: id, OfflineDebounce: 10 * time.Millisecond}, nil, lua.RTDisconnect)
	if _, err := p.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	c := failedRemoval(t, p, f)
	if err := p.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close() // the removal's retry is dropped with the instance
	if admin.Exists(ctx, presence.InstanceKey(id)).Val() != 0 {
		t.Fatal("the liveness marker outlived the deregistration")
	}
	if err := admin.ZScore(ctx, presence.InstanceConnsKey(id), c.UserID+":"+c.ConnID).Err(); err != nil {
		t.Fatalf("the connection left the index with its removal outstanding: %v", err)
	}
	sweeper := newPresence(t, presence.Config{LivenessTTL: 200 * time.Millisecond, OfflineDebounce: 10 * time.Millisecond}, nil)
	testenv.Eventually(t, 10*time.Second, func() bool {
		if _, err := sweeper.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		return admin.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() == redis.Nil
	}, "no survivor swept the connection whose removal failed")
}

// A removal that failed and was taken again later also takes the
// connection out of the instance's index: nothing else would while the
// instance lives, and every failure left an entry for the index to carry
// (renewed by every liveness refresh) and for a sweeper to go through.
func TestARetakenRemovalLeavesTheIndex(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	id := "retake-" + ids.New()[24:]
	p, f := presenceWithFault(t, presence.Config{InstanceID: id, RetakeAfter: 50 * time.Millisecond, OfflineDebounce: 10 * time.Millisecond},
		nil, lua.RTDisconnect)
	c := failedRemoval(t, p, f)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return admin.ZScore(ctx, presence.UserConnsKey(c.UserID), c.ConnID).Err() == redis.Nil
	}, "the failed removal was not taken again")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return admin.ZScore(ctx, presence.InstanceConnsKey(id), c.UserID+":"+c.ConnID).Err() == redis.Nil
	}, "the retaken connection stayed in the instance's index")
}

// A registration that ran but whose reply was lost (a Redis that stalled
// and woke) set its user online with nobody told; the user's next connect
// found the user online and announced nothing. Once the refused
// registration is taken back (DisconnectLater), the user, live on the
// later connection, is announced online.
func TestAnUnknownRegistrationTakenBackAnnouncesALiveUser(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p, f := presenceWithFault(t, presence.Config{RetakeAfter: 50 * time.Millisecond, OfflineDebounce: 10 * time.Millisecond},
		rec, lua.RTHeartbeat)
	// As on a running service, the scripts are loaded: the lost reply is
	// of a registration that ran.
	warm := presence.Conn{UserID: ids.New(), ConnID: "warm"}
	if err := p.Connect(ctx, warm); err != nil {
		t.Fatal(err)
	}
	u := ids.New()
	f.lose.Store(true)
	refused := presence.Conn{UserID: u, ConnID: "refused"}
	if err := p.Connect(ctx, refused); err == nil {
		t.Fatal("the lost reply did not fail the registration")
	}
	p.DisconnectLater(refused) // as the handshake that was refused does
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "retry"}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rec.list(), "+"+u) {
		t.Fatal("the retried connection announced the user, whose online marker the lost registration had set: the test shows nothing")
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) },
		"the user, live on the retried connection, was never announced online")
	if got := rec.list(); slices.Contains(got, "-"+u) {
		t.Fatalf("the user, live all along, was announced offline: %v", got)
	}
}

// failedRemoval registers a connection of a new user on p and removes it
// with f failing every removal (f must fail RTDisconnect): the removal is
// left for the retry.
func failedRemoval(t *testing.T, p *presence.Presence, f *scriptFault) presence.Conn {
	t.Helper()
	ctx := context.Background()
	c := presence.Conn{UserID: ids.New(), ConnID: "c1"}
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	if _, err := p.Disconnect(ctx, c.UserID, c.ConnID); err == nil {
		t.Fatal("the injected failure did not fail the removal")
	}
	return c
}

// A drain whose removals fail (a stalled Redis) queues them to be taken
// again, but the queue is bounded: what does not fit is never taken again
// by this instance. Once the queued ones are retaken and the queue is
// empty, Deregister must still leave the index to the survivors, or the
// connections that overflowed would stay registered (their users reading
// online) until they went stale, and their users would never be announced
// offline.
func TestDeregisterLeavesConnectionsThatOverflowedTheRetakeQueueToTheSurvivors(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	rec := &recorder{}
	id := "ovf-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, RetakeAfter: 50 * time.Millisecond, OfflineDebounce: 10 * time.Millisecond}, rec)
	const queued = 4
	p.SetRetakeCap(queued)
	conns := make([]presence.Conn, 3*queued)
	for i := range conns {
		conns[i] = presence.Conn{UserID: ids.New(), ConnID: "c1"}
		if err := p.Connect(ctx, conns[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	// The drain's removal gets no answer.
	dctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.DisconnectMany(dctx, conns); err == nil {
		t.Fatal("the removal did not fail")
	}
	// Redis answers again: the queued removals are taken again, and their
	// index entries go with them.
	testenv.Eventually(t, 5*time.Second, func() bool {
		n := 0
		for _, c := range conns {
			if admin.ZScore(ctx, presence.InstanceConnsKey(id), c.UserID+":"+c.ConnID).Err() == redis.Nil {
				n++
			}
		}
		return n == queued
	}, "the queued removals were not taken again")
	if err := p.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	// Its users' offline checks run; those of the connections it could
	// not remove wait for ConnTTL and are dropped with the instance.
	p.Shutdown(ctx, time.Second)

	sweeper := newPresence(t, presence.Config{LivenessTTL: 200 * time.Millisecond, OfflineDebounce: 10 * time.Millisecond}, rec)
	if _, err := sweeper.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if n, err := sweeper.Online(ctx, c.UserID); err != nil || n != 0 {
			t.Fatalf("user %s, whose socket closed, still reads %d live connections (%v): nobody swept it", c.UserID, n, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		got := rec.list()
		for _, c := range conns {
			if !slices.Contains(got, "-"+c.UserID) {
				return false
			}
		}
		return true
	}, "not every user whose socket closed was announced offline: %v", rec.list())
}

// A user announced online once a refused registration is taken back
// (DisconnectLater) is stamped with Redis's time, as every other
// transition is: one clock for all of a user's transitions, so a client
// that keeps the latest orders them right whichever instance's clock is
// off. The host clock cannot be moved here, so the test checks the bound
// that matters: the announcement is no later than Redis's time read after
// it, and no earlier than Redis's time read before the take-back.
func TestAnOnlineAnnouncedAfterATakeBackHasRedisTime(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	rec := &timed{}
	p := newPresence(t, presence.Config{RetakeAfter: 50 * time.Millisecond}, rec)
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "live"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return rec.count(true) == 1 }, "the connect was not announced")
	before, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	p.DisconnectLater(presence.Conn{UserID: u, ConnID: "refused"})
	testenv.Eventually(t, 5*time.Second, func() bool { return rec.count(true) == 2 },
		"the user, live after the take-back, was not announced online")
	after, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	at := rec.at[1]
	rec.mu.Unlock()
	if at.Before(before.Truncate(time.Millisecond)) || at.After(after.Truncate(time.Millisecond)) {
		t.Fatalf("announced at %d ms, outside Redis's time around it [%d, %d] ms", at.UnixMilli(), before.UnixMilli(), after.UnixMilli())
	}
	if !at.Equal(at.Truncate(time.Millisecond)) {
		t.Fatalf("announced at %v: not a Redis time (Redis's clock counts milliseconds)", at)
	}
}

// A removal Redis did not answer reports no time: the caller records the
// user's last-seen time from it, which only moves forward, so this host's
// clock (possibly ahead) must not stand in for Redis's; the offline
// transition that follows the removal's retry carries Redis's time.
func TestARemovalRedisDidNotAnswerReportsNoTime(t *testing.T) {
	ctx := context.Background()
	p := newPresence(t, presence.Config{OfflineDebounce: 10 * time.Millisecond}, nil)
	c := presence.Conn{UserID: ids.New(), ConnID: "c1"}
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if at, err := p.Disconnect(dead, c.UserID, c.ConnID); err == nil || !at.IsZero() {
		t.Fatalf("a disconnect Redis did not answer reported %v (%v), want no time and an error", at, err)
	}
	if at, err := p.DisconnectMany(dead, []presence.Conn{c}); err == nil || !at.IsZero() {
		t.Fatalf("a drain removal Redis did not answer reported %v (%v), want no time and an error", at, err)
	}
	before, err := client(t).Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	at, err := p.Disconnect(ctx, c.UserID, c.ConnID)
	if err != nil || at.Before(before.Truncate(time.Millisecond)) {
		t.Fatalf("a removal Redis answered reported %v (%v), want Redis's time, not before %v", at, err, before)
	}
}
