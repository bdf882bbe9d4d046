package project

import (
	"context"
	"time"

	"github.com/han-app/gateway/internal/combine"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// The publish, claim and ack scripts each take many items: the messages of
// one topic, the claims or the acks of one subscription, handled in order
// as separate calls would be. Concurrent calls of one Queue go out through
// a merger: while a round trip is in flight the next calls queue, and when
// it ends those of one script on the same keys become one script call with
// one item each, the others share its pipeline. A lone call is sent at once.
// Redis then pays a script's entry, its checks and most of its commands
// once for all the items, not once per call.
//
// There is one merger per node of the batcher (rds.Batcher.NodeOf): on a
// standalone Redis one, on a cluster one per master, chosen by the slot of
// the call's first key (a project's keys share one hash tag). A round trip
// then holds the calls of one master only, as the batcher's pipelines do: a
// master that stalls holds its own calls (which leave the queue at their
// own deadline) and none of the healthy masters'. A call routed on a slot
// map that is about to change still reaches the right master: the batcher
// routes it again, and go-redis follows a MOVED.

const (
	// mergeInFlight is how many round trips of one merger run at once. One:
	// the calls that arrive meanwhile wait for it and merge into fewer,
	// larger script calls (two in flight cost Redis and the client more CPU
	// per message in the queue benchmark, docs/benchmarks.md).
	mergeInFlight = 1
	// mergeMax bounds the calls of one round trip.
	mergeMax = 48
	// mergeSharedBudget bounds a shared round trip (combine.SharedContext).
	mergeSharedBudget = 2 * time.Second
)

// mergeCall is one caller's item of a script call.
type mergeCall struct {
	ctx    context.Context
	script *lua.Script
	keys   []string
	head   []any // the arguments before the items, the same for every item of a script call (strings and integers)
	item   []any // this call's item
	// rows tells how the reply splits: one row per item (publish, ack),
	// else {outcome, now, items of each claim…} (claim).
	rows bool

	res []any // this call's part of the reply
	err error
}

// newMergeCall returns the call of script s with keys, the shared head and
// this caller's item.
func newMergeCall(ctx context.Context, s *lua.Script, rows bool, keys []string, head []any, item ...any) *mergeCall {
	return &mergeCall{ctx: ctx, script: s, keys: keys, head: head, item: item, rows: rows}
}

// mergesWith tells whether c and o can be one script call: the same
// script, keys and head.
func (c *mergeCall) mergesWith(o *mergeCall) bool {
	if c.script != o.script || len(c.keys) != len(o.keys) || len(c.head) != len(o.head) {
		return false
	}
	for i, k := range c.keys {
		if o.keys[i] != k {
			return false
		}
	}
	for i, a := range c.head {
		if o.head[i] != a {
			return false
		}
	}
	return true
}

// merge runs c, with other callers' calls when they meet, and returns its
// part of the reply.
func (q *Queue) merge(c *mergeCall) ([]any, error) {
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, q.cfg.RedisBudget)
	defer cancel()
	c.ctx = ctx
	if err := q.mergerOf(c).DoCtx(ctx, c); err != nil {
		return nil, err
	}
	return c.res, c.err
}

// mergerOf returns the merger of c's node: that of the master owning the
// slot of c's first key on a cluster, the only one on a standalone Redis.
func (q *Queue) mergerOf(c *mergeCall) *combine.Combiner[*mergeCall] {
	node := ""
	if len(c.keys) > 0 {
		node = q.batch.NodeOf(c.ctx, c.keys[0])
	}
	if m, ok := q.mergers.Load(node); ok {
		return m.(*combine.Combiner[*mergeCall])
	}
	m, _ := q.mergers.LoadOrStore(node, &combine.Combiner[*mergeCall]{Exec: q.execMerged, InFlight: mergeInFlight, Max: mergeMax})
	return m.(*combine.Combiner[*mergeCall])
}

// execMerged sends one batch: one script call per set of calls that merge,
// in the order the sets first appear, in one pipeline.
func (q *Queue) execMerged(batch []*mergeCall) {
	var sets [][]*mergeCall
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			continue
		}
		i := 0
		for i < len(sets) && !sets[i][0].mergesWith(c) {
			i++
		}
		if i == len(sets) {
			sets = append(sets, make([]*mergeCall, 0, len(batch)))
		}
		sets[i] = append(sets[i], c)
	}
	if len(sets) == 0 {
		return
	}
	calls := make([]rds.ScriptCall, len(sets))
	for i, set := range sets {
		first := set[0]
		args := make([]any, 0, len(first.head)+len(set)*len(first.item))
		args = append(args, first.head...)
		for _, c := range set {
			args = append(args, c.item...)
		}
		calls[i] = rds.ScriptCall{Script: first.script, Keys: first.keys, Args: args}
	}
	ctx, cancel := combine.SharedContext(batch, func(c *mergeCall) context.Context { return c.ctx }, mergeSharedBudget)
	defer cancel()
	for i, cmd := range q.batch.Scripts(ctx, calls...) {
		res, err := cmd.Slice()
		splitReply(sets[i], res, err)
	}
}

// splitReply gives each call of one script call its part of the reply.
func splitReply(cs []*mergeCall, res []any, err error) {
	if err == nil && cs[0].rows && len(res) != len(cs) {
		err = ErrDataStateInvalid
	}
	for j, c := range cs {
		switch {
		case err != nil:
			c.err = err
		case c.rows:
			c.res, _ = res[j].([]any)
			if c.res == nil {
				c.err = ErrDataStateInvalid
			}
		case outcome(res) == "ok" && len(res) == 2+len(cs):
			c.res = []any{res[0], res[1], res[2+j]}
		case outcome(res) == "ok":
			c.err = ErrDataStateInvalid
		default:
			c.res = res
		}
	}
}
