package presence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/store/rds"
)

// Empty restore for realtime: all Redis data is lost; the next
// heartbeat of every live connection writes its presence again, so the
// users are online again without reconnecting.
func TestPresenceRebuildsFromHeartbeatsAfterEmptyRestore(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	rt, err := rds.NewRedis(r.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	p, err := presence.New(rt, presence.Config{InstanceID: "i-" + ids.New()[24:]}, &recorder{},
		slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	alice, bob := ids.New(), ids.New()
	conns := []presence.Conn{{UserID: alice, ConnID: "a1"}, {UserID: alice, ConnID: "a2"}, {UserID: bob, ConnID: "b1"}}
	for _, c := range conns {
		if err := p.Connect(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	admin := r.AdminClient(1)
	defer admin.Close()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := p.Online(ctx, alice); n != 0 {
		t.Fatalf("after FLUSHALL alice still has %d connections", n)
	}
	if err := p.Refresh(ctx, conns); err != nil {
		t.Fatalf("heartbeat after the empty restore: %v", err)
	}
	if n, err := p.Online(ctx, alice); err != nil || n != 2 {
		t.Fatalf("alice after the heartbeat: %d %v", n, err)
	}
	if n, err := p.Online(ctx, bob); err != nil || n != 1 {
		t.Fatalf("bob after the heartbeat: %d %v", n, err)
	}
	bad, err := r.KeysWithoutTTL(ctx)
	if err != nil || len(bad) > 0 {
		t.Fatalf("rebuilt keys without a TTL: %v %v", bad, err)
	}
}
