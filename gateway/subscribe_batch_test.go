package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A reconnect storm's resubscribes: 50 sockets each subscribe to the same
// 20 dialogs at once (1,000 subscribes, members and non-members mixed).
// Every member gets subscribed with its dialog's lastSeq, every non-member
// error dialog_not_found, and the membership checks and lastSeq reads
// share far fewer PostgreSQL queries than there are checks.
func TestConcurrentSubscribesShareChecksExactly(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	const nUsers, nDialogs = 50, 20
	users := in.users(nUsers)
	// Dialog k: members users[k], users[k+1], users[k+2]; last_seq 100+k.
	dialogs := make([]string, nDialogs)
	member := func(u, k int) bool { return u >= k && u <= k+2 }
	for k := range dialogs {
		dialogs[k] = in.dialog(users[k], users[k+1], users[k+2])
		if _, err := pool.Exec(context.Background(), `UPDATE dialogs SET last_seq = $2 WHERE id = $1`, dialogs[k], 100+k); err != nil {
			t.Fatal(err)
		}
	}
	clients := make([]*client, nUsers)
	for u := range clients {
		clients[u] = in.connect(users[u])
	}
	before := in.svc.Stats()
	var wg sync.WaitGroup
	for u, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, d := range dialogs {
				c.sendRaw(`{"type":"subscribe","dialogId":"` + d + `"}`)
			}
			for k, d := range dialogs {
				var f frame
				for f = c.next(20 * time.Second); f.Type == "event"; f = c.next(20 * time.Second) {
				}
				switch {
				case member(u, k) && (f.Type != "subscribed" || f.DialogID != d || f.LastSeq != int64(100+k)):
					t.Errorf("user %d, dialog %d (member): got %s, want subscribed with lastSeq %d", u, k, f.raw, 100+k)
				case !member(u, k) && (f.Type != "error" || f.Error != "dialog_not_found"):
					t.Errorf("user %d, dialog %d (non-member): got %s, want error dialog_not_found", u, k, f.raw)
				}
			}
		}()
	}
	wg.Wait()
	after := in.svc.Stats()
	checks, queries := after.SubscribeChecks-before.SubscribeChecks, after.SubscribeCheckQueries-before.SubscribeCheckQueries
	// A member's subscribe checks twice (membership, then lastSeq after the
	// SUBSCRIBE) unless the instance already listens on the channel (then
	// once, after attaching); a non-member's once.
	members := 0
	for u := range nUsers {
		for k := range nDialogs {
			if member(u, k) {
				members++
			}
		}
	}
	if lo, hi := uint64(nUsers*nDialogs), uint64(nUsers*nDialogs+members); checks < lo || checks > hi {
		t.Fatalf("%d checks, want %d to %d", checks, lo, hi)
	}
	if queries == 0 || queries > checks/3 {
		t.Fatalf("%d checks took %d queries, want at most a third", checks, queries)
	}
	t.Logf("%d subscribes (%d members): %d checks, %d queries", nUsers*nDialogs, members, checks, queries)
}
