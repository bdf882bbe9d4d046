package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A user in more dialogs than a transition is published to (1,000) has it
// published to the most recent ones, those at the top of the dialog
// listing: bob, in alice's newest dialog, hears that alice came online
// although she is in 1,000 older ones (dialog ids are time ordered, so
// the oldest 1,000 are also the first 1,000 by id). The 1,000 publishes go
// out in shared pipelines, not a round trip each. The control, with 10
// older dialogs, is under the cap: all 11 hear it, in one or two round
// trips.
func TestPresenceReachesTheUsersNewestDialog(t *testing.T) { presenceNewest(t, 1000) }

func TestPresenceReachesTheUsersNewestDialogControl(t *testing.T) { presenceNewest(t, 10) }

func presenceNewest(t *testing.T, n int) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(2)
	alice, bob := u[0], u[1]
	ctx := context.Background()
	old := make([]string, n)
	for i := range old {
		old[i] = ids.New()
	}
	if _, err := pool.Exec(ctx, `INSERT INTO dialogs(id, title, created_by, created_at)
		SELECT unnest($1::uuid[]), 'old', $2, now() - interval '1 hour'`, old, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO dialog_members(dialog_id, user_id) SELECT unnest($1::uuid[]), $2`, old, alice); err != nil {
		t.Fatal(err)
	}
	d := in.dialog(alice, bob) // the newest dialog: alice and bob talk here
	b := in.connect(bob)
	b.subscribe(d)
	pubs := &dialogPublishes{user: alice}
	in.rt.AddHook(pubs)
	in.connect(alice)
	awaitPresence(t, b, alice, true, d)
	want := min(n+1, 1000)
	testenv.Eventually(t, 10*time.Second, func() bool { return pubs.publishes.Load() >= int64(want) },
		"alice's transition was published to fewer than her %d most recent dialogs", want)
	if got, trips := pubs.publishes.Load(), pubs.trips.Load(); got != int64(want) || trips > max(int64(want)/10, 2) {
		t.Fatalf("alice's transition: %d publishes in %d round trips, want %d publishes sharing pipelines", got, trips, want)
	}
}

// While Redis refuses publishes, a transition still reaches, through the
// publisher's local fallback, this instance's sockets in every dialog of
// the user: a failed publish to one dialog does not stop those to the
// others.
func TestPresenceReachesEveryDialogWhilePublishesFail(t *testing.T) {
	r, admin := privateRedis(t)
	in := newInstance(t, openPool(t), opts{rtURL: r.URL(1)})
	u := in.users(2)
	alice, bob := u[0], u[1]
	dialogs := []string{in.dialog(alice, bob), in.dialog(alice, bob), in.dialog(bob, alice)}
	b := in.connect(bob)
	for _, d := range dialogs {
		b.subscribe(d)
	}
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "api_backend", "-publish", "-spublish").Err(); err != nil {
		t.Fatal(err)
	}
	in.connect(alice)
	awaitPresence(t, b, alice, true, dialogs...)
}

// The users a closing instance drained are announced offline to the
// members of their dialogs on other instances: the offline transitions
// fall due after the instance's publisher stopped taking publishes that
// nobody waits for.
func TestPresenceOfflineOfAClosingInstanceReachesTheOthers(t *testing.T) {
	pool := openPool(t)
	a, other := newInstance(t, pool, opts{}), newInstance(t, pool, opts{})
	u := a.users(2)
	alice, bob := u[0], u[1]
	d := a.dialog(alice, bob)
	b := other.connect(bob)
	b.subscribe(d)
	a.connect(alice)
	awaitPresence(t, b, alice, true, d)
	a.svc.Close()
	awaitPresence(t, b, alice, false, d)
}

// awaitPresence waits for c's presence.changed of user in each of dialogs,
// in any order, skipping other frames.
func awaitPresence(t *testing.T, c *client, user string, online bool, dialogs ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, d := range dialogs {
		missing[d] = true
	}
	deadline := time.After(10 * time.Second)
	for len(missing) > 0 {
		select {
		case f := <-c.frames:
			if f.Type != "event" || f.Event != gateway.EventPresenceChanged {
				continue
			}
			var p struct {
				UserID string `json:"userId"`
				Online bool   `json:"online"`
			}
			if err := json.Unmarshal(f.Data, &p); err != nil {
				t.Fatal(err)
			}
			if p.UserID == user && p.Online == online {
				delete(missing, f.DialogID)
			}
		case <-c.done:
			t.Fatalf("connection ended: %v", c.err)
		case <-deadline:
			t.Fatalf("no presence.changed {online: %v} of %s in %d of its %d dialogs", online, user, len(missing), len(dialogs))
		}
	}
}

// dialogPublishes counts the publishes of user's events to dialog channels
// a go-redis client sends and the round trips (one command alone, or one
// pipeline) that carry them.
type dialogPublishes struct {
	user             string
	publishes, trips atomic.Int64
}

func (w *dialogPublishes) count(cmds []redis.Cmder) {
	n := int64(0)
	for _, c := range cmds {
		if name := c.Name(); name != "publish" && name != "spublish" {
			continue
		}
		ch, _ := c.Args()[1].(string)
		payload, _ := c.Args()[2].([]byte)
		if strings.HasPrefix(ch, pubsub.DialogChannel("")) && bytes.Contains(payload, []byte(w.user)) {
			n++
		}
	}
	if n > 0 {
		w.publishes.Add(n)
		w.trips.Add(1)
	}
}

func (w *dialogPublishes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *dialogPublishes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (w *dialogPublishes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.count(cmds)
		return next(ctx, cmds)
	}
}
