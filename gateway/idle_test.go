package gateway_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
)

// An idle connection costs the server one goroutine (its reader): the
// writer runs only while something is queued (docs/benchmarks.md, the idle
// memory target). The test process also runs each client's read loop, so a
// connection costs two goroutines here in all; with a resident writer it
// would cost three. After the idle period the writers start again on
// demand: events still reach every connection.
func TestIdleConnectionHoldsOneGoroutine(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	const n = 40
	users := in.users(n)
	dialogID := in.dialog(users[0], users[1])
	settle := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	base := settle()
	clients := make([]*client, n)
	for i, u := range users {
		clients[i] = in.connect(u)
	}
	clients[1].subscribe(dialogID)
	var got int
	testenv.Eventually(t, 10*time.Second, func() bool {
		got = settle() - base
		return got <= 2*n+n/4
	}, "goroutines for %d idle connections", n)
	t.Logf("%d idle connections: %d goroutines (server and client side)", n, got)

	msg := in.post(users[0], dialogID, "after idle")
	for i := 0; ; i++ { // presence events may come first
		f := clients[1].next(10 * time.Second)
		if f.Type == "event" && f.DialogID == dialogID && f.Seq == msg.Seq {
			break
		}
		if i == 20 {
			t.Fatalf("no event for seq %d after idle; last frame %s", msg.Seq, f.raw)
		}
	}
}
