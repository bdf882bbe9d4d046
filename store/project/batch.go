package project

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// Script batching. Publish, claim and ack each run one script whose keys
// and arguments do not depend on any other call's reply, so calls that
// arrive together can share one round trip: while a batch is in flight,
// the next calls queue, and when it ends they go out as one pipeline. A
// lone call is sent at once (no added wait); under load, one write and one
// read on the client and on Redis carry many scripts. Each script stays
// atomic on its own; the pipeline only shares the connection.
const (
	// batchInFlight is how many pipelines run at once: two keep Redis busy
	// while the client reads the previous replies and writes the next
	// requests.
	batchInFlight = 2
	// batchMax bounds one pipeline.
	batchMax = 64
)

// batchCall is one script call waiting in a batch.
type batchCall struct {
	ctx    context.Context
	script *lua.Script
	keys   []string
	args   []any
	res    []any
	err    error
	// wake receives nil when res/err are set, or the batch this caller
	// must now send (it holds the caller's own call).
	wake chan []*batchCall
}

// scriptBatcher sends script calls in pipelines. Safe for concurrent use.
type scriptBatcher struct {
	rdb redis.UniversalClient

	mu       sync.Mutex
	queue    []*batchCall // calls waiting for a free pipeline
	inFlight int          // pipelines being sent or read now
}

// run executes the script and returns its reply as a slice, like
// Script.Run(...).Slice().
func (b *scriptBatcher) run(ctx context.Context, s *lua.Script, keys []string, args ...any) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &batchCall{ctx: ctx, script: s, keys: keys, args: args}
	b.mu.Lock()
	if b.inFlight < batchInFlight {
		b.inFlight++
		batch := append([]*batchCall{c}, b.takeLocked()...)
		b.mu.Unlock()
		b.send(batch)
		return c.res, c.err
	}
	c.wake = make(chan []*batchCall, 1)
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	if batch := <-c.wake; batch != nil {
		b.send(batch)
	}
	return c.res, c.err
}

// takeLocked removes up to batchMax-1 queued calls.
func (b *scriptBatcher) takeLocked() []*batchCall {
	n := min(len(b.queue), batchMax-1)
	out := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return out
}

// send runs batch as one pipeline, wakes its other callers, and hands the
// pipeline slot to the next queued caller (or frees it).
func (b *scriptBatcher) send(batch []*batchCall) {
	b.exec(batch)
	for _, c := range batch[1:] {
		c.wake <- nil
	}
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	next := b.queue[0]
	b.queue = b.queue[1:]
	batch = append([]*batchCall{next}, b.takeLocked()...)
	b.mu.Unlock()
	next.wake <- batch
}

// exec sends the calls whose context is still live, with EVALSHA; a
// script Redis does not know (after a restart or SCRIPT FLUSH) is sent
// again alone through Script.Run, which loads it.
func (b *scriptBatcher) exec(batch []*batchCall) {
	live := batch[:0:0]
	for _, c := range batch {
		if c.err = c.ctx.Err(); c.err == nil {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 {
		c := live[0]
		c.res, c.err = c.script.Run(c.ctx, b.rdb, c.keys, c.args...).Slice()
		return
	}
	// The calls share one connection: the pipeline runs for the longest
	// of their deadlines and is not cut short by any one caller leaving.
	ctx, cancel := uncancelable(live[0].ctx)
	defer cancel()
	cmds := make([]*redis.Cmd, len(live))
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range live {
			if c.script.ReadOnly {
				cmds[i] = p.EvalShaRO(ctx, c.script.Hash(), c.keys, c.args...)
			} else {
				cmds[i] = p.EvalSha(ctx, c.script.Hash(), c.keys, c.args...)
			}
		}
		return nil
	})
	for i, c := range live {
		c.res, c.err = cmds[i].Slice()
		if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
			c.res, c.err = c.script.Run(c.ctx, b.rdb, c.keys, c.args...).Slice()
		}
	}
}
