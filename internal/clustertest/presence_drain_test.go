package clustertest_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
)

// A draining instance's batched removal on the cluster: one pipeline holds
// the scripts of users on every master (each script on its own user's
// slot); every drained connection is gone,
// and a user with a connection on another instance stays online with the
// exact count. Deregistering hands the pending offline checks on in the
// instance's index.
func TestDisconnectManyOnCluster(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	p, err := presence.New(rdb, presence.Config{InstanceID: "drain-" + ids.New()[24:], OfflineDebounce: time.Hour}, nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	other, err := presence.New(rdb, presence.Config{InstanceID: "other-" + ids.New()[24:], OfflineDebounce: time.Hour}, nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	var conns []presence.Conn
	users := make([]string, 300)
	for i := range users {
		users[i] = ids.New()
		for _, c := range []string{"a", "b"}[:1+i%2] {
			conns = append(conns, presence.Conn{UserID: users[i], ConnID: c})
		}
	}
	for _, c := range conns {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Connect(ctx, presence.Conn{UserID: users[0], ConnID: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second removal is a harmless duplicate
		if _, err := p.DisconnectMany(ctx, conns); err != nil {
			t.Fatal(err)
		}
	}
	for i, u := range users {
		n, err := p.Online(ctx, u)
		if want := map[bool]int{true: 1, false: 0}[i == 0]; err != nil || n != want {
			t.Fatalf("user %d: %d live connections (%v), want %d", i, n, err, want)
		}
	}
	if err := p.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	// The index keeps only the offline checks still pending (one per
	// user left with no live connection), for the survivors should the
	// instance die before they run.
	left, err := rdb.ZRange(ctx, presence.InstanceConnsKey(p.Config().InstanceID), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, u := range users[1:] {
		want[u+":~offline"] = true
	}
	for _, m := range left {
		if !want[m] {
			t.Fatalf("instance index holds %q after Deregister", m)
		}
	}
	if len(left) != len(want) {
		t.Fatalf("instance index holds %d pending checks after Deregister, want %d", len(left), len(want))
	}
}
