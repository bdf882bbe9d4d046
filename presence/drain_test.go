package presence_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// DisconnectMany (a drain) removes hundreds of users' connections per round
// trip, one script per user; a user who also has a connection on another
// instance stays online with the exact count; a second removal of the same
// connections is harmless and reports nothing new; the users left with no
// connection are reported offline once, their debounced checks batched too.
func TestDisconnectManyIsBatchedAndExact(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	var w wire
	rdb.AddHook(&w)
	rec := &recorder{}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	cfg := presence.Config{InstanceID: "i-" + ids.New()[24:], OfflineDebounce: 100 * time.Millisecond}
	p, err := presence.New(rdb, cfg, rec, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	other := newPresence(t, presence.Config{}, nil)

	const users = 600
	var conns []presence.Conn
	userIDs := make([]string, users)
	for i := range userIDs {
		userIDs[i] = ids.New()
		for j := range 1 + i%2 { // every other user has two sockets here
			conns = append(conns, presence.Conn{UserID: userIDs[i], ConnID: "c" + strconv.Itoa(j)})
		}
	}
	for _, c := range conns {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// The first ten users also have a socket on another instance.
	for _, u := range userIDs[:10] {
		if err := other.Connect(ctx, presence.Conn{UserID: u, ConnID: "elsewhere"}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == users }, "online transitions")

	w.trips.Store(0)
	w.cmds.Store(0)
	if _, err := p.DisconnectMany(ctx, conns); err != nil {
		t.Fatal(err)
	}
	trips, cmds := w.trips.Load(), w.cmds.Load()
	t.Logf("DisconnectMany of %d connections of %d users: %d round trips, %d commands", len(conns), users, trips, cmds)
	if trips > 2 || cmds > users {
		t.Fatalf("%d round trips and %d commands, want 2 and ≤ one per user", trips, cmds)
	}
	if _, err := p.DisconnectMany(ctx, conns[:50]); err != nil {
		t.Fatal(err)
	}
	for i, u := range userIDs[:20] {
		n, err := p.Online(ctx, u)
		if want := map[bool]int{true: 1, false: 0}[i < 10]; err != nil || n != want {
			t.Fatalf("user %d: %d live connections (%v), want %d", i, n, err, want)
		}
	}
	w.trips.Store(0)
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rec.list()) == 2*users-10 }, "offline transitions")
	time.Sleep(3 * cfg.OfflineDebounce)
	got := rec.list()[users:]
	if len(got) != users-10 {
		t.Fatalf("%d offline transitions, want %d", len(got), users-10)
	}
	for _, u := range userIDs[:10] {
		if slices.Contains(got, "-"+u) {
			t.Fatalf("user %s, still connected elsewhere, reported offline", u)
		}
	}
	if trips := w.trips.Load(); trips > 4 {
		t.Fatalf("the offline checks of %d users took %d round trips, want them batched", users, trips)
	}
	if err := p.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if left, _ := rdb.Exists(ctx, presence.InstanceConnsKey(cfg.InstanceID)).Result(); left != 0 {
		t.Fatal("instance index left after Deregister")
	}
}
