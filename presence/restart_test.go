package presence_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/presence"
)

// An instance that restarts with the id of an earlier life that crashed
// (a fixed HAN_INSTANCE_ID) starts, clears what that life left and reports
// its users offline.
func TestRestartWithTheSameInstanceIDStarts(t *testing.T) {
	ctx := context.Background()
	cfg := presence.Config{InstanceID: "reuse-" + ids.New()[24:], OfflineDebounce: 50 * time.Millisecond}
	first := newPresence(t, cfg, nil)
	u := ids.New()
	if err := first.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	first.Close() // a crash: nothing is removed from Redis

	rec := &recorder{}
	second, err := presence.New(client(t), cfg, rec, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go func() {
		second.Start(func() []presence.Conn { return nil })
		close(started)
	}()
	select {
	case <-started:
		t.Cleanup(second.Close)
	case <-time.After(30 * time.Second):
		// Not closed: Close would wait for the Start that hangs.
		t.Fatal("Start with the instance id of an earlier life did not return")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Contains(rec.list(), "-"+u) },
		"the earlier life's user was not reported offline: %v", rec.list())
	if n, err := second.Online(ctx, u); err != nil || n != 0 {
		t.Fatalf("the earlier life's connection is still live: %d %v", n, err)
	}
}
