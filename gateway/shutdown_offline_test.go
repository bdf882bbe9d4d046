package gateway_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/pubsub"
)

// slowPublishes delays each PUBLISH of user's presence on a dialog channel
// once armed: a publish that takes 400 ms (a distant Redis, a busy one),
// well within the 5 s budget of one transition callback.
type slowPublishes struct {
	user  string
	armed atomic.Bool
}

func (w *slowPublishes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *slowPublishes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if w.armed.Load() && (cmd.Name() == "publish" || cmd.Name() == "spublish") {
			ch, _ := cmd.Args()[1].(string)
			payload, _ := cmd.Args()[2].([]byte)
			if strings.HasPrefix(ch, pubsub.DialogChannel("")) && bytes.Contains(payload, []byte(w.user)) {
				time.Sleep(400 * time.Millisecond)
			}
		}
		return next(ctx, cmd)
	}
}
func (w *slowPublishes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A shutdown whose deadline is far away (30 s) does not cut the offline
// transitions of the users it drained: a decided transition runs even
// when the instance is closing, so it never leaves a user shown online
// whose marker it removed. The wait for pending offline checks is bounded
// (OfflineDebounce + 1 s), and the callbacks were cut at the end of that
// wait: with publishes taking 400 ms each, bob heard alice go offline in
// 2 of her 5 dialogs.
func TestAShutdownDoesNotCutTheOfflineTransitionsItDrained(t *testing.T) {
	pool := openPool(t)
	in1 := newInstance(t, pool, opts{})
	in2 := newInstance(t, pool, opts{})
	u := in1.users(2)
	alice, bob := u[0], u[1]
	var ds []string
	for range 5 {
		ds = append(ds, in1.dialog(alice, bob))
	}
	b := in2.connect(bob)
	for _, d := range ds {
		b.subscribe(d)
	}
	slow := &slowPublishes{user: alice}
	in1.rt.AddHook(slow)
	in1.connect(alice)
	awaitPresence(t, b, alice, true, ds...)
	slow.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	in1.svc.Shutdown(ctx)
	t.Logf("shutdown took %v of its 30 s", time.Since(start))
	awaitPresence(t, b, alice, false, ds...)
}
