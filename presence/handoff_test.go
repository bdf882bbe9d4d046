package presence_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// Offline checks outlive the instance that scheduled them. A user's last
// disconnect is announced after the debounce by the instance that saw it;
// should that instance die inside the debounce, a survivor's sweep runs
// the check instead, and should that survivor die before running it, the
// next one does. Each announces the user offline once, and not at all when
// the user came back meanwhile.

// doomed is an instance with a user who connected and left, killed before
// its offline check (a minute away) ran: its marker lapses, and its
// registry entry and index are left to the survivors.
func doomed(t *testing.T, rec *recorder) (id, user string) {
	t.Helper()
	ctx := context.Background()
	rdb := client(t)
	id = "doomed-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, LivenessTTL: 300 * time.Millisecond, OfflineDebounce: time.Minute}, rec)
	if _, err := p.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	user = ids.New()
	c := presence.Conn{UserID: user, ConnID: ids.New()}
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 1 }, "no online transition")
	if _, err := p.Disconnect(ctx, user, c.ConnID); err != nil {
		t.Fatal(err)
	}
	p.Close() // killed: the pending check goes with it
	testenv.Eventually(t, 5*time.Second, func() bool { return rdb.Exists(ctx, presence.InstanceKey(id)).Val() == 0 },
		"the killed instance's marker never expired")
	return id, user
}

// survivor is a started instance that sweeps dead instances.
func survivor(t *testing.T, debounce time.Duration, rec *recorder) (*presence.Presence, string) {
	t.Helper()
	id := "survivor-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, LivenessTTL: 300 * time.Millisecond,
		SweepInterval: 100 * time.Millisecond, OfflineDebounce: debounce}, rec)
	p.Start(func() []presence.Conn { return nil })
	return p, id
}

func offlineEvents(rec *recorder, user string) int {
	n := 0
	for _, e := range rec.list() {
		if e == "-"+user {
			n++
		}
	}
	return n
}

func TestAKilledInstancesOfflineCheckRunsOnASurvivor(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	_, u := doomed(t, rec)
	survivor(t, 50*time.Millisecond, rec)
	testenv.Eventually(t, 10*time.Second, func() bool { return offlineEvents(rec, u) > 0 },
		"the user of the killed instance was never announced offline: %v", rec.list())
	time.Sleep(500 * time.Millisecond) // a second announcement would show here
	if n := offlineEvents(rec, u); n != 1 {
		t.Fatalf("%d offline announcements, want one", n)
	}
	if rdb.Exists(ctx, presence.OnlineKey(u)).Val() != 0 {
		t.Fatal("the online marker outlived the announcement")
	}
}

func TestAUserBackBeforeTheSurvivorsCheckIsNotAnnounced(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	_, u := doomed(t, rec)
	const debounce = time.Second
	s, sid := survivor(t, debounce, rec)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return rdb.ZScore(ctx, presence.InstanceConnsKey(sid), u+":~offline").Err() == nil
	}, "the survivor never took over the killed instance's offline check")
	c := presence.Conn{UserID: u, ConnID: ids.New()}
	if err := s.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	// The check (cancelled by the reconnect) falls due and takes its
	// index member with it.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return rdb.ZScore(ctx, presence.InstanceConnsKey(sid), u+":~offline").Err() == redis.Nil
	}, "the cancelled check's index member stayed")
	time.Sleep(debounce)
	if n := offlineEvents(rec, u); n != 0 {
		t.Fatalf("the user, back on the survivor, was announced offline %d times", n)
	}
	if rdb.Exists(ctx, presence.OnlineKey(u)).Val() != 1 {
		t.Fatal("the online marker of a user who is back is gone")
	}
}

func TestASurvivorKilledBeforeTheCheckItTookOverHandsItOn(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	deadID, u := doomed(t, rec)
	// The first survivor sweeps the killed instance, then is killed
	// itself before its check (a minute away) runs.
	sid := "survivor-" + ids.New()[24:]
	first := newPresence(t, presence.Config{InstanceID: sid, LivenessTTL: 300 * time.Millisecond, OfflineDebounce: time.Minute}, rec)
	if _, err := first.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if rdb.ZCard(ctx, presence.InstanceConnsKey(deadID)).Val() != 0 {
		t.Fatal("the first survivor did not sweep the killed instance")
	}
	first.Close()
	testenv.Eventually(t, 5*time.Second, func() bool { return rdb.Exists(ctx, presence.InstanceKey(sid)).Val() == 0 },
		"the first survivor's marker never expired")
	if offlineEvents(rec, u) != 0 {
		t.Fatal("announced before the second survivor came")
	}
	survivor(t, 50*time.Millisecond, rec)
	testenv.Eventually(t, 10*time.Second, func() bool { return offlineEvents(rec, u) > 0 },
		"the check the killed survivor took over was lost: %v", rec.list())
	time.Sleep(500 * time.Millisecond)
	if n := offlineEvents(rec, u); n != 1 {
		t.Fatalf("%d offline announcements, want one", n)
	}
	if rdb.Exists(ctx, presence.OnlineKey(u)).Val() != 0 {
		t.Fatal("the online marker outlived the announcement")
	}
}

// An offline check is listed in its instance's index while it waits, and
// no longer once it ran or a reconnect cancelled it: the index does not
// grow with every user who ever left.
func TestOfflineChecksLeaveNothingInTheIndex(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	const debounce = 300 * time.Millisecond
	id := "listed-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, OfflineDebounce: debounce}, rec)
	index := presence.InstanceConnsKey(id)

	gone, back := ids.New(), ids.New()
	for _, u := range []string{gone, back} {
		if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Disconnect(ctx, u, "c1"); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZScore(ctx, index, u+":~offline").Err(); err != nil {
			t.Fatalf("the pending check is not listed in the index: %v", err)
		}
	}
	if err := p.Connect(ctx, presence.Conn{UserID: back, ConnID: "c2"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return offlineEvents(rec, gone) == 1 }, "the user who left was not announced")
	testenv.Eventually(t, 10*time.Second, func() bool {
		m, err := rdb.ZRange(ctx, index, 0, -1).Result()
		return err == nil && len(m) == 1 && m[0] == back+":c2"
	}, "the index holds %v, want only the live connection", rdb.ZRange(ctx, index, 0, -1).Val())
	if offlineEvents(rec, back) != 0 {
		t.Fatal("the user who came back was announced offline")
	}

	// A disconnect that leaves the user another live connection lists
	// no check either.
	if err := p.Connect(ctx, presence.Conn{UserID: back, ConnID: "c3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Disconnect(ctx, back, "c2"); err != nil {
		t.Fatal(err)
	}
	if m := rdb.ZRange(ctx, index, 0, -1).Val(); len(m) != 1 || m[0] != back+":c3" {
		t.Fatalf("the index holds %v, want only the live connection", m)
	}
}

// A graceful shutdown deregisters before its drain's offline checks run:
// should the instance then be killed, the survivors still announce the
// drained users.
func TestADrainedUserIsAnnouncedWhenTheInstanceDiesAfterDeregistering(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	id := "drained-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, OfflineDebounce: time.Minute}, rec)
	if _, err := p.RefreshLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	u := ids.New()
	c := presence.Conn{UserID: u, ConnID: ids.New()}
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DisconnectMany(ctx, []presence.Conn{c}); err != nil {
		t.Fatal(err)
	}
	if err := p.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if m := rdb.ZRange(ctx, presence.InstanceConnsKey(id), 0, -1).Val(); len(m) != 1 || m[0] != u+":~offline" {
		t.Fatalf("after deregistering, the index holds %v, want only the drained user's check", m)
	}
	p.Close() // killed while its checks wait
	survivor(t, 50*time.Millisecond, rec)
	testenv.Eventually(t, 10*time.Second, func() bool { return offlineEvents(rec, u) == 1 },
		"the drained user was never announced offline: %v", rec.list())
	testenv.Eventually(t, 10*time.Second, func() bool { return rdb.ZScore(ctx, presence.InstancesKey, id).Err() == redis.Nil },
		"the deregistered instance stayed in the registry")
}

// Two disconnect pipelines of one user run at once: the first (whose
// removal left the user another connection) lists the user's check, the
// second (the last connection) lists it again, a little later, and
// schedules the check. The first's bookkeeping, coming last, must not hand
// the check its older score: the check would then remove only a member
// at that score, and the one listed later would stay in the index.
func TestALateListingReplyLeavesNoMemberBehind(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	rec := &recorder{}
	id := "late-" + ids.New()[24:]
	p := newPresence(t, presence.Config{InstanceID: id, OfflineDebounce: 300 * time.Millisecond}, rec)
	index := presence.InstanceConnsKey(id)
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Disconnect(ctx, u, "c1"); err != nil {
		t.Fatal(err)
	}
	listed, err := rdb.ZScore(ctx, index, u+":~offline").Result()
	if err != nil {
		t.Fatalf("the pending check is not listed in the index: %v", err)
	}
	p.Adopt([]string{u}, int64(listed)-5) // the earlier pipeline's reply
	testenv.Eventually(t, 10*time.Second, func() bool { return offlineEvents(rec, u) == 1 }, "the user was not announced offline")
	testenv.Eventually(t, 10*time.Second, func() bool { return rdb.Exists(ctx, index).Val() == 0 || rdb.ZCard(ctx, index).Val() == 0 },
		"the index still holds %v after the check ran", rdb.ZRangeWithScores(ctx, index, 0, -1).Val())
}
