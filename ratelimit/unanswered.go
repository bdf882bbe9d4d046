package ratelimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Admissions of requests that never proceeded. A decision that got no reply
// may still run: a Redis that stalls instead of failing runs the calls it
// had received when it wakes, long after the request was refused (503 on a
// route that fails closed). A sliding-log admission run so counts a request
// that never happened for its whole window, and a client that retried
// through the stall would meet 429 for requests it was refused. The sliding
// log names each admission by its request id, so the limiter keeps the ids
// of such decisions and gives their admissions back (ZREM, which touches
// nothing else) before its next decisions, once Redis answers again.
//
// Fixed windows and token buckets cannot tell one admission from another;
// their over-count heals when the window passes, as does that of a
// fallback-local policy, whose refused-by-Redis requests went ahead on the
// in-process limiter.
const (
	// maxUnanswered bounds the remembered decisions; past it an admission
	// run late stays counted until its window passes.
	maxUnanswered = 1024
	// unansweredEvery spaces the refund passes; a pass runs before a
	// decision, so at most one request in this period pays its round trip.
	unansweredEvery = 250 * time.Millisecond
	// unansweredBatch is the most decisions one pass gives back.
	unansweredBatch = 32
	// unansweredBudget bounds one pass.
	unansweredBudget = 250 * time.Millisecond
	// unansweredSettle is how long a decision whose refund found no
	// admission is kept and tried again: its call may not have run yet (a
	// woken Redis runs what it had received within its first event-loop
	// turns), or it was denied, or it never arrived.
	unansweredSettle = 2 * time.Second
)

// unanswered is a sliding-log decision that got no reply.
type unanswered struct {
	id    string
	keys  []string
	rules []Rule
}

// rememberUnanswered keeps the decision of request id over keys, whose call
// got no reply, for refundUnanswered (until its admission would leave every
// window anyway): only a sliding log, and only where the request was
// refused when Redis did not answer (fail-closed). On a Redis Cluster each
// family was its own call, which admitted on its own key or not, and the
// keys live on different masters: each is kept, and given back, on its own.
func (l *Limiter) rememberUnanswered(p Policy, id string, keys []string, rules []Rule) {
	if p.Algorithm != SlidingLog || p.OnFailure == FallbackLocal || len(keys) == 0 {
		return
	}
	if l.perFamily {
		for i := range keys {
			l.unanswered.Add(unanswered{id: id, keys: keys[i : i+1], rules: rules[i : i+1]}, rules[i].Window)
		}
		return
	}
	var longest time.Duration
	for _, r := range rules {
		longest = max(longest, r.Window)
	}
	l.unanswered.Add(unanswered{id: id, keys: keys, rules: rules}, longest)
}

// multiScripts is a ScriptRunner that sends several calls in one pipeline
// (rds.Batcher).
type multiScripts interface {
	Scripts(ctx context.Context, calls ...rds.ScriptCall) []*redis.Cmd
}

// refundUnanswered gives back the admissions of remembered decisions, at
// most unansweredBatch of them, in one pipeline, no more often than
// unansweredEvery, before a decision over keys. A decision goes once its
// refund removed its admission (a sliding log writes every family or none,
// so one key tells), once its window passed, or unansweredSettle after a
// refund first found nothing; a refund that got no reply keeps it.
//
// On a Redis Cluster only the decisions whose keys live on the masters of
// keys are given back (the masters the decision waits for anyway): a
// decision on a master that stalls would otherwise make every decision on
// the healthy ones wait out the pass's budget on it. The others wait for a
// decision on their master, or lapse with their window.
func (l *Limiter) refundUnanswered(keys []string) {
	now := time.Now()
	all := l.unanswered.Take(now)
	if len(all) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unansweredBudget)
	defer cancel()
	todo, elsewhere := l.onMastersOf(ctx, keys, all)
	defer l.unanswered.Keep(elsewhere...)
	if len(todo) == 0 {
		return
	}
	var calls []rds.ScriptCall
	for _, e := range todo {
		for i, k := range e.V.keys {
			r := e.V.rules[i]
			calls = append(calls, rds.ScriptCall{Script: lua.RateLimitRefund, Keys: []string{k},
				Args: []any{string(SlidingLog), e.V.id, r.Window.Milliseconds(), Jitter(k, r.Window), 0, r.Limit}})
		}
	}
	var replies []*redis.Cmd
	if m, ok := l.scripts.(multiScripts); ok {
		replies = m.Scripts(ctx, calls...)
	} else {
		for _, c := range calls {
			replies = append(replies, l.scripts.Script(ctx, c.Script, c.Keys, c.Args...))
		}
	}
	next := 0
	for _, e := range todo {
		rs := replies[next : next+len(e.V.keys)]
		next += len(e.V.keys)
		removed, failed := false, false
		for _, r := range rs {
			n, err := r.Int()
			removed = removed || (err == nil && n == 1)
			failed = failed || err != nil
		}
		switch {
		case removed:
			l.metrics.refund("unanswered")
		case failed:
			l.unanswered.Keep(e)
		default:
			l.unanswered.Settling(now, e)
		}
	}
}

// onMastersOf splits remembered decisions into at most unansweredBatch whose
// keys all live on the masters of keys (every one on a single Redis) and
// the rest, in order.
func (l *Limiter) onMastersOf(ctx context.Context, keys []string, es []rds.LateCall[unanswered]) (on, rest []rds.LateCall[unanswered]) {
	masters := make(map[string]bool, len(keys))
	for _, k := range keys {
		masters[rds.MasterAddr(ctx, l.rdb, k)] = true
	}
	for _, e := range es {
		ok := len(on) < unansweredBatch
		for _, k := range e.V.keys {
			ok = ok && masters[rds.MasterAddr(ctx, l.rdb, k)]
		}
		if ok {
			on = append(on, e)
		} else {
			rest = append(rest, e)
		}
	}
	return on, rest
}
