package presence_test

import (
	"context"
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

// pipelineHold holds the next pipeline match accepts, once armed, until
// released, then sends it as if it had been sent then.
type pipelineHold struct {
	match   func(cmds []redis.Cmder) bool
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newPipelineHold(match func(cmds []redis.Cmder) bool) *pipelineHold {
	return &pipelineHold{match: match, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *pipelineHold) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.match(cmds) && h.armed.CompareAndSwap(true, false) {
			close(h.entered)
			<-h.release
			return next(context.WithoutCancel(ctx), cmds)
		}
		return next(ctx, cmds)
	}
}

// isRefresh matches a periodic refresh pipeline (heartbeats passing the
// closed marker, a fourth key).
func isRefresh(cmds []redis.Cmder) bool {
	if len(cmds) == 0 {
		return false
	}
	args := cmds[0].Args()
	return len(args) > 2 && fmt.Sprint(args[1]) == lua.RTHeartbeat.Hash() && fmt.Sprint(args[2]) == "4"
}

// heartbeatRace registers one connection, holds the next periodic
// heartbeat that lists it, lets remove take the connection out of
// presence meanwhile (the hub forgot it first: no later heartbeat lists
// it), then lets the held heartbeat through and checks that it registered
// nothing: the user is announced offline and has no live connection.
func heartbeatRace(t *testing.T, remove func(ctx context.Context, p *presence.Presence, c presence.Conn) error) (redis.UniversalClient, presence.Config, presence.Conn) {
	t.Helper()
	ctx := context.Background()
	rdb := client(t)
	hold := newPipelineHold(isRefresh)
	rdb.AddHook(hold)
	rec := &recorder{}
	cfg := presence.Config{InstanceID: "i-" + ids.New()[24:], RefreshInterval: 100 * time.Millisecond,
		OfflineDebounce: 100 * time.Millisecond}
	p, err := presence.New(rdb, cfg, rec, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	u := ids.New()
	c := presence.Conn{UserID: u, ConnID: "c1"}
	var open atomic.Bool
	p.Start(func() []presence.Conn {
		if open.Load() {
			return []presence.Conn{c}
		}
		return nil
	})
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	open.Store(true)
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) }, "no online transition")

	hold.armed.Store(true)
	select {
	case <-hold.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no periodic heartbeat listed the connection")
	}
	open.Store(false)
	if err := remove(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	close(hold.release)

	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Contains(rec.list(), "-"+u) },
		"the user was never announced offline: %v", rec.list())
	if n, err := p.Online(ctx, u); err != nil || n != 0 {
		t.Fatalf("live connections after the only one was removed: %d %v", n, err)
	}
	return rdb, cfg, c
}

// A socket that closes while the periodic heartbeat of a list that still
// holds it is on its way is not registered again by that heartbeat: the
// user has no live connection left and is announced offline.
func TestHeartbeatDoesNotRestoreAClosedConnection(t *testing.T) {
	rdb, cfg, c := heartbeatRace(t, func(ctx context.Context, p *presence.Presence, c presence.Conn) error {
		_, err := p.Disconnect(ctx, c.UserID, c.ConnID)
		return err
	})
	testenv.Eventually(t, 5*time.Second, func() bool {
		return rdb.ZScore(context.Background(), presence.InstanceConnsKey(cfg.InstanceID), c.UserID+":"+c.ConnID).Err() == redis.Nil
	}, "the closed connection is still in the instance index")
}

// The same for a draining instance: a socket it closes and removes with
// DisconnectMany while a periodic heartbeat that still lists it is on its
// way (sent before the drain began) is not registered again by that
// heartbeat. Otherwise the registration outlives the instance (its index
// goes with Deregister, so no sweep removes it), the drain's offline check
// finds it live, and no instance ever announces the user offline.
func TestHeartbeatDoesNotRestoreADrainedConnection(t *testing.T) {
	heartbeatRace(t, func(ctx context.Context, p *presence.Presence, c presence.Conn) error {
		_, err := p.DisconnectMany(ctx, []presence.Conn{c})
		return err
	})
}
