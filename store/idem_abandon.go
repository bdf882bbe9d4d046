package store

import (
	"context"
	"slices"
	"sync"
	"time"

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

// abandoner gives up, from one goroutine that runs only while tokens wait,
// the owner tokens of calls that got no reply.
type abandoner struct {
	mu      sync.Mutex
	pending []abandonment
	running bool
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
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
	start := !a.running
	if start {
		a.running = true
		a.wg.Add(1)
	}
	a.mu.Unlock()
	if start {
		go i.abandonLoop()
	}
}

// abandonLoop tries the waiting tokens until none is left or the store
// closes.
func (i *Idempotency) abandonLoop() {
	defer i.ab.wg.Done()
	t := time.NewTimer(abandonEvery)
	defer t.Stop()
	for {
		select {
		case <-i.ab.stop:
			return
		case <-t.C:
		}
		if !i.abandonPass() {
			return
		}
		t.Reset(abandonEvery)
	}
}

// abandonPass drops the tokens past their deadline and, while DB0 is up,
// gives up the oldest batch in one pipeline. It reports whether tokens
// still wait (false also marks the loop stopped).
func (i *Idempotency) abandonPass() bool {
	a := &i.ab
	now := time.Now()
	a.mu.Lock()
	n := len(a.pending)
	a.pending = slices.DeleteFunc(a.pending, func(x abandonment) bool { return now.After(x.until) })
	expired := n - len(a.pending)
	batch := slices.Clone(a.pending[:min(len(a.pending), abandonBatch)])
	a.mu.Unlock()
	i.abandoned(AbandonExpired, expired)
	if len(batch) > 0 && i.health.Check() == nil {
		done := i.abandonBatch(batch)
		a.mu.Lock()
		// Only this goroutine removes tokens and new ones are appended, so
		// the batch is still the head of the queue.
		kept := a.pending[:0]
		for j, x := range a.pending {
			if j >= len(batch) || !done[j] {
				kept = append(kept, x)
			}
		}
		clear(a.pending[len(kept):])
		a.pending = kept
		a.mu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) == 0 {
		a.running = false
		return false
	}
	return true
}

// abandonBatch runs idem_abandon for each token of batch in one pipeline
// and reports which were given up.
func (i *Idempotency) abandonBatch(batch []abandonment) []bool {
	ctx, cancel := context.WithTimeout(context.Background(), abandonBudget)
	defer cancel()
	calls := make([]rds.ScriptCall, len(batch))
	ttl := i.cfg.LockTTL.Milliseconds()
	for j, x := range batch {
		calls[j] = rds.ScriptCall{Script: lua.IdemAbandon, Keys: x.k.ownerKeys(), Args: []any{x.owner, ttl}}
	}
	done := make([]bool, len(batch))
	for j, cmd := range i.rdb.Scripts(ctx, calls...) {
		n, err := cmd.Int64()
		if err != nil {
			_ = i.health.Observe(err)
			continue
		}
		done[j] = true
		if n == 1 {
			i.abandoned(AbandonReleased, 1)
		} else {
			i.abandoned(AbandonMarked, 1)
		}
	}
	return done
}

func (i *Idempotency) abandoned(outcome string, n int) {
	if i.cfg.OnAbandon == nil {
		return
	}
	for range n {
		i.cfg.OnAbandon(outcome)
	}
}

// abandonClose stops the loop and waits for it; tokens still waiting are
// dropped.
func (i *Idempotency) abandonClose() {
	a := &i.ab
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	close(a.stop)
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	n := len(a.pending)
	a.pending = nil
	a.mu.Unlock()
	i.abandoned(AbandonDropped, n)
}
