package presence_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/presence"
)

// After Redis lost its script cache (a restart, a failover to a replica,
// SCRIPT FLUSH) the scripts are loaded again by whichever call meets
// NOSCRIPT first; meanwhile another pipeline finds some of them loaded and
// others not. Its scripts that ran must not run a second time: a
// registration run twice answers the second time that the user was
// already online, and the user's online transition is never announced
// (its dialogs show it offline while it is connected).
func TestConnectWhileScriptsAreReloadedAnnouncesOnline(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p := newPresence(t, presence.Config{}, rec)
	rdb := client(t)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Another call's reload got as far as the registration script.
	if err := lua.RTHeartbeat.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	u := ids.New()
	if err := p.Connect(ctx, presence.Conn{UserID: u, ConnID: "c1"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rec.list(), "+"+u) },
		"the user's first connection was never announced online: %v", rec.list())
	if err := rdb.ZScore(ctx, presence.InstanceConnsKey(p.Config().InstanceID), u+":c1").Err(); err != nil {
		t.Fatalf("the connection is not in the instance index: %v", err)
	}
}
