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
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
)

// An offline check already running when the instance closes (its shutdown
// wait ran out, or it is killed) still announces what Redis decided: the
// user's online marker is gone, so the offline transition is reported.
// Dropped, the user's dialogs would keep showing them online, with no
// later transition to correct it.
func TestAnOfflineCheckRunningAtCloseIsAnnounced(t *testing.T) {
	ctx := context.Background()
	rdb := client(t)
	hold := newPipelineHold((&scriptFault{scripts: []*lua.Script{lua.RTOffline}}).matches)
	hold.armed.Store(true) // the first offline check
	rdb.AddHook(hold)
	rec := &recorder{}
	p, err := presence.New(rdb, presence.Config{InstanceID: "i-" + ids.New()[24:], OfflineDebounce: 50 * time.Millisecond},
		rec, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	u := ids.New()
	c := presence.Conn{UserID: u, ConnID: "c1"}
	if err := p.Connect(ctx, c); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) }, "no online transition")
	if _, err := p.Disconnect(ctx, u, c.ConnID); err != nil {
		t.Fatal(err)
	}
	<-hold.entered // the check is on its way to Redis
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	// Close has begun (it waits for the running check); then Redis answers.
	time.Sleep(100 * time.Millisecond)
	close(hold.release)
	<-closed
	if got := rec.list(); !slices.Equal(got, []string{"+" + u, "-" + u}) {
		t.Fatalf("transitions %v: the check Redis ran while the instance closed was not announced", got)
	}
	if n := client(t).Exists(ctx, presence.OnlineKey(u)).Val(); n != 0 {
		t.Fatal("the user is still marked online")
	}
}
