package store

import (
	"context"
	"sync"
	"time"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Outcomes of an abandoned owner token (IdempotencyConfig.OnAbandon).
const (
	AbandonReleased = "released" // the call had taken the lock: given back
	AbandonMarked   = "marked"   // it had not (yet): a late copy now takes nothing
	AbandonExpired  = "expired"  // Redis did not answer within one lock TTL
	AbandonDropped  = "dropped"  // the queue was full or the store closed
)

const (
	// abandonMax bounds the tokens waiting to be given up; past it a token
	// is dropped and a lock its call took expires with its TTL.
	abandonMax = 4096
	// abandonEvery is the pause between tries while tokens wait.
	abandonEvery = 100 * time.Millisecond
	// abandonBatch is how many tokens one pipeline gives up.
	abandonBatch = 32
	// abandonBudget bounds one such pipeline.
	abandonBudget = time.Second
)

// abandonment is one owner token to give up on one key, until a deadline.
type abandonment struct {
	k     IdemKey
	owner string
	until time.Time
}

// abandoner holds the owner tokens of calls that got no reply; a loop that
// runs only while tokens wait gives them up.
type abandoner struct {
	mu      sync.Mutex // guards pending, closed
	pending []abandonment
	closed  bool
	loop    *loop.Loop
}

func (i *Idempotency) initAbandoner() {
	i.ab.loop = loop.New(loop.Config{Interval: abandonEvery, Timeout: abandonBudget}, i.abandonPass)
}

// abandonLater queues owner's token on k to be given up (idem_abandon) once
// Redis answers: a reserve, takeover or release that got no reply may have
// run, or may still run when a stalled Redis wakes up, and leave a lock for
// a request that no longer runs. Tried every abandonEvery while DB0 is up,
// for at most one lock TTL (after that the lock has expired by itself).
func (i *Idempotency) abandonLater(k IdemKey, owner string) {
	a := &i.ab
	a.mu.Lock()
	if a.closed || len(a.pending) >= abandonMax {
		a.mu.Unlock()
		i.abandoned(AbandonDropped, 1)
		return
	}
	a.pending = append(a.pending, abandonment{k: k, owner: owner, until: time.Now().Add(i.cfg.LockTTL)})
	a.mu.Unlock()
	a.loop.Start()
}

// abandonPass drops the tokens past their deadline (every token gets the
// same lifetime, so they are the head of the queue) and gives up, in one
// pipeline, the oldest batch of those whose master is up (all of DB0 on a
// single Redis): on a Redis Cluster the tokens on a master that stalls
// wait, without holding back those on the healthy masters behind them. It
// reports whether tokens still wait.
func (i *Idempotency) abandonPass(ctx context.Context) bool {
	a := &i.ab
	now := time.Now()
	a.mu.Lock()
	expired := 0
	for expired < len(a.pending) && now.After(a.pending[expired].until) {
		expired++
	}
	a.pending = a.pending[expired:]
	var batch []abandonment
	var at []int // batch[j] is a.pending[at[j]]
	for j, x := range a.pending {
		if len(batch) == abandonBatch {
			break
		}
		if i.health.CheckKey(x.k.RecordKey()) == nil {
			batch = append(batch, x)
			at = append(at, j)
		}
	}
	a.mu.Unlock()
	i.abandoned(AbandonExpired, expired)
	if len(batch) > 0 {
		done := i.abandonBatch(ctx, batch)
		gone := map[int]bool{}
		for j := range batch {
			gone[at[j]] = done[j]
		}
		a.mu.Lock()
		// Only this loop removes tokens and new ones are appended, so
		// each token of the batch is still where it was.
		kept := a.pending[:0]
		for j, x := range a.pending {
			if !gone[j] {
				kept = append(kept, x)
			}
		}
		clear(a.pending[len(kept):])
		a.pending = kept
		a.mu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending) > 0
}

// abandonBatch runs idem_abandon for each token of batch in one pipeline
// and reports which were given up.
func (i *Idempotency) abandonBatch(ctx context.Context, batch []abandonment) []bool {
	calls := make([]rds.ScriptCall, len(batch))
	ttl := i.cfg.LockTTL.Milliseconds()
	for j, x := range batch {
		calls[j] = rds.ScriptCall{Script: lua.IdemAbandon, Keys: x.k.ownerKeys(), Args: []any{x.owner, ttl}}
	}
	done := make([]bool, len(batch))
	released, marked := 0, 0
	for j, cmd := range i.rdb.Scripts(ctx, calls...) {
		n, err := cmd.Int64()
		switch {
		case err != nil:
			_ = i.health.ObserveKey(batch[j].k.RecordKey(), err)
			continue
		case n == 1:
			released++
		default:
			marked++
		}
		done[j] = true
	}
	i.abandoned(AbandonReleased, released)
	i.abandoned(AbandonMarked, marked)
	return done
}

func (i *Idempotency) abandoned(outcome string, n int) {
	if n > 0 && i.cfg.OnAbandon != nil {
		i.cfg.OnAbandon(outcome, n)
	}
}

// abandonClose stops the loop and waits for it; tokens still waiting are
// dropped.
func (i *Idempotency) abandonClose() {
	a := &i.ab
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.loop.Close()
	a.mu.Lock()
	n := len(a.pending)
	a.pending = nil
	a.mu.Unlock()
	i.abandoned(AbandonDropped, n)
}
