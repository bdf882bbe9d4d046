package rds

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/combine"
	"github.com/han-app/gateway/internal/workers"
	"github.com/han-app/gateway/lua"
)

// Batcher sends the Redis calls of concurrent callers in shared pipelines.
// Each call (a script, or a realtime PUBLISH) has keys and arguments that do
// not depend on any other call's reply, so calls that arrive together can
// share one round trip: while a pipeline is in flight, the next calls queue,
// and when it ends they go out together. A lone call is sent at once (or
// after the linger, SetLinger); under load, one write and one read on the
// client and one wake-up of Redis carry many calls. Each script stays
// atomic on its own; the pipeline only shares the connection. A caller's
// calls still queued when its context ends leave unsent with the context's
// error (combine.Combiner.DoCtx): pipelines that a stalled Redis holds keep
// no queued caller past its own deadline. Safe for concurrent use.
//
// On a Redis Cluster client a pipeline never spans nodes: calls are routed
// by their first key (a publish by its channel) to the lane of the master
// that owns its slot — its own combiner, pipelines in flight and queue of
// calls nobody waits for — because go-redis answers a cluster pipeline only
// once every node in it has answered: a master that stalls (before its
// failover) would hold the calls of every healthy master that shared its
// pipelines, and those queued behind them. A caller's calls for several
// masters (Scripts) go to their lanes at once.
// The slot-to-master map is go-redis's own, reloaded on MOVED, when a node
// stops answering and every ClusterSlotMapMaxAge; a call routed on a stale
// map is still redirected by go-redis, its pipeline then spanning the old
// and the new owner once. On a standalone client there is one lane and the
// routing costs one nil check.
type Batcher struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil on a standalone client
	one     *lane                // a standalone client's only lane
	linger  time.Duration        // of every lane (SetLinger)

	// lanes holds a cluster client's lanes by master address, read without
	// mu and replaced whole (under mu) when a lane is added; a master's lane
	// stays after a failover moved its slots away, idle.
	lanes  atomic.Pointer[map[string]*lane]
	mu     sync.Mutex // guards adding lanes, closed
	closed bool       // Close was called: new lanes refuse later calls
}

// lane is the calls of one node (a standalone server, or one cluster
// master): they share pipelines, at most batchInFlight at once.
type lane struct {
	b    *Batcher
	comb combine.Combiner[*batchCall]
	lq   laterQueue // ScriptLater / PublishLater
}

const (
	// batchInFlight is how many pipelines of one lane run at once: two keep
	// Redis busy while the client reads the previous replies and writes the
	// next requests.
	batchInFlight = 2
	// batchMax bounds one pipeline.
	batchMax = 64
	// batchSharedBudget bounds a shared pipeline (combine.SharedContext).
	batchSharedBudget = 2 * time.Second
)

// NewBatcher returns a batcher over rdb: one lane on a standalone client,
// one per master on a cluster client.
func NewBatcher(rdb redis.UniversalClient) *Batcher {
	b := &Batcher{rdb: rdb}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		b.cluster = cc
		b.lanes.Store(&map[string]*lane{})
	} else {
		b.one = b.newLane()
	}
	return b
}

func (b *Batcher) newLane() *lane {
	l := &lane{b: b}
	l.lq.senders = workers.New(laterSenders, 0, func(calls []*batchCall) {
		l.sendLater(calls)
		l.lq.flights.Done()
	})
	l.comb = combine.Combiner[*batchCall]{Exec: l.exec, InFlight: batchInFlight, Max: batchMax, Linger: b.linger}
	return l
}

// SetLinger sets how long a call that finds a pipeline free waits for the
// calls of other requests to share it (0: sent at once). Call it before
// the Batcher is used.
func (b *Batcher) SetLinger(d time.Duration) {
	b.linger = max(d, 0)
	if b.one != nil {
		b.one.comb.Linger = b.linger
	}
}

// laneOf returns the lane of c: on a cluster, that of the master owning the
// slot of c's first key or channel (ctx bounds a first load of the slot
// map). A keyless call, or one routed while the client has no slot map,
// goes to a lane of its own, whose pipelines go-redis splits by node.
func (b *Batcher) laneOf(ctx context.Context, c *batchCall) *lane {
	if b.cluster == nil {
		return b.one
	}
	key := c.channel
	if c.script != nil {
		key = ""
		if len(c.keys) > 0 {
			key = c.keys[0]
		}
	}
	addr := b.NodeOf(ctx, key)
	if l := (*b.lanes.Load())[addr]; l != nil {
		return l
	}
	return b.addLane(addr)
}

// NodeOf names the lane that calls whose first key (or channel) is key go
// to: on a cluster client, the address of the master that owns key's slot
// in the client's slot map (ctx bounds a first load of the map); "" on a
// standalone client, for no key, or while the client has no slot map. A
// layer that gathers calls before they reach the batcher (the project
// queue's merged script calls) keeps one gathering per name, so that a
// stalled master holds only the calls of its own slots there too.
func (b *Batcher) NodeOf(ctx context.Context, key string) string {
	if b.cluster == nil || key == "" {
		return ""
	}
	node, err := b.cluster.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

func (b *Batcher) addLane(addr string) *lane {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := *b.lanes.Load()
	if l := old[addr]; l != nil {
		return l
	}
	l := b.newLane()
	l.lq.closed = b.closed
	lanes := make(map[string]*lane, len(old)+1)
	maps.Copy(lanes, old)
	lanes[addr] = l
	b.lanes.Store(&lanes)
	return l
}

// allLanes returns every lane made so far.
func (b *Batcher) allLanes() []*lane {
	if b.cluster == nil {
		return []*lane{b.one}
	}
	return slices.Collect(maps.Values(*b.lanes.Load()))
}

// batchCall is one call waiting in a batch: a script (script set) or a
// realtime publish (channel set).
type batchCall struct {
	ctx     context.Context
	script  *lua.Script
	keys    []string
	args    []any
	channel string
	payload []byte
	sharded bool // a publish: SPUBLISH

	res *redis.Cmd    // a script's reply
	pub *redis.IntCmd // a publish's reply

	done func(*batchCall) // a call nobody waits for: gets the reply
}

// Script runs s with keys and args like s.Run (EVALSHA, loading the script
// again when Redis does not know it) and returns its reply.
func (b *Batcher) Script(ctx context.Context, s *lua.Script, keys []string, args ...any) *redis.Cmd {
	c := &batchCall{ctx: ctx, script: s, keys: keys, args: args}
	b.do(c)
	return c.res
}

// Publish sends payload on a realtime channel as Publish does for mode.
func (b *Batcher) Publish(ctx context.Context, mode PubSubMode, channel string, payload []byte) *redis.IntCmd {
	sharded, err := ShardedPubSub(b.rdb, mode)
	if err != nil {
		return Publish(ctx, b.rdb, mode, channel, payload) // the mode's error
	}
	c := &batchCall{ctx: ctx, channel: channel, payload: payload, sharded: sharded}
	b.do(c)
	return c.pub
}

// ScriptCall is one script call of Batcher.Scripts.
type ScriptCall struct {
	Script *lua.Script
	Keys   []string
	Args   []any
}

// Scripts runs the calls in one pipeline (with other callers' calls, as
// Script does) and returns their replies in order: one round trip for
// calls of one request that do not depend on each other's replies.
func (b *Batcher) Scripts(ctx context.Context, calls ...ScriptCall) []*redis.Cmd {
	cs := make([]*batchCall, len(calls))
	for i, sc := range calls {
		cs[i] = &batchCall{ctx: ctx, script: sc.Script, keys: sc.Keys, args: sc.Args}
	}
	b.do(cs...)
	out := make([]*redis.Cmd, len(cs))
	for i, c := range cs {
		out[i] = c.res
	}
	return out
}

// do sends the calls cs of one caller, together when a pipeline is free
// (else queued in order), and returns once each has its reply. Calls still
// queued in a lane when their context ends leave it unsent with the
// context's error (combine.Combiner.DoCtx); on a cluster a caller's calls
// for several masters go to each master's lane at once.
func (b *Batcher) do(cs ...*batchCall) {
	if b.cluster == nil {
		b.one.do(cs...)
		return
	}
	if err := cs[0].ctx.Err(); err != nil {
		for _, c := range cs {
			c.fail(err) // not routed: a first slot-map load would fail with it
		}
		return
	}
	if len(cs) == 1 {
		b.laneOf(cs[0].ctx, cs[0]).do(cs...)
		return
	}
	type group struct {
		l  *lane
		cs []*batchCall
	}
	var groups []group
	for _, c := range cs {
		l := b.laneOf(c.ctx, c)
		i := slices.IndexFunc(groups, func(g group) bool { return g.l == l })
		if i < 0 {
			i = len(groups)
			groups = append(groups, group{l: l})
		}
		groups[i].cs = append(groups[i].cs, c)
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Go(func() { g.l.do(g.cs...) })
	}
	groups[0].l.do(groups[0].cs...)
	wg.Wait()
}

// do sends the calls cs of one caller on this lane. They share one context
// (the caller's).
func (l *lane) do(cs ...*batchCall) {
	ctx := cs[0].ctx
	if err := ctx.Err(); err != nil {
		for _, c := range cs {
			c.fail(err)
		}
		return
	}
	if err := l.comb.DoCtx(ctx, cs...); err != nil {
		for _, c := range cs {
			if c.res == nil && c.pub == nil { // left the queue unsent
				c.fail(err)
			}
		}
	}
}

// fail sets err as the call's reply.
func (c *batchCall) fail(err error) {
	if c.script != nil {
		c.res = redis.NewCmd(c.ctx)
		c.res.SetErr(err)
		return
	}
	c.pub = redis.NewIntCmd(c.ctx)
	c.pub.SetErr(err)
}

// alone runs the call on its own, with its own context.
func (b *Batcher) alone(c *batchCall) {
	if c.script != nil {
		c.res = c.script.Run(c.ctx, b.rdb, c.keys, c.args...)
		return
	}
	c.pub = b.publish(c.ctx, b.rdb, c)
}

// publish runs (on a client) or queues (on a pipeline) c's publish. On a
// cluster a classic PUBLISH, which any node takes and forwards to the
// others, goes to the master of the channel's slot, like an SPUBLISH:
// go-redis would send it to any master, and a lane's pipeline stays on its
// lane's node.
func (b *Batcher) publish(ctx context.Context, p commander, c *batchCall) *redis.IntCmd {
	if b.cluster == nil || c.sharded {
		return publishOn(ctx, p, c.sharded, c.channel, c.payload)
	}
	return publishOnce(ctx, p, "publish", c.channel, c.payload)
}

// commander is a client or a pipeline.
type commander interface {
	redis.Cmdable
	Process(ctx context.Context, cmd redis.Cmder) error
}

// exec sends the calls whose context is still live; a script Redis does not
// know (after a restart or SCRIPT FLUSH) is sent again alone through
// Script.Run, which loads it.
func (l *lane) exec(batch []*batchCall) {
	b := l.b
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.fail(err)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	// Calls nobody waits for that are queued now ride along, first (they
	// were queued before the calls after them in this pipeline): the round
	// trip is made anyway, and their own pipeline would be one more write
	// and one more wake-up of Redis.
	var rides []*batchCall
	if rideRoom(live) {
		rides = l.lq.takeRides()
	}
	if len(live) == 1 && len(rides) == 0 {
		b.alone(live[0])
		return
	}
	// The pipeline's context covers this lane's callers only: on a
	// cluster, those of one master. With rides on board it runs to its
	// deadline even when every waiting caller leaves: the rides wait for
	// no one and must still go out.
	shared := combine.SharedContext[*batchCall]
	if len(rides) > 0 {
		shared = combine.SharedDeadline[*batchCall]
	}
	ctx, cancel := shared(live, func(c *batchCall) context.Context { return c.ctx }, batchSharedBudget)
	defer cancel()
	if len(rides) > 0 {
		for _, c := range rides {
			c.ctx = ctx
		}
		live = append(rides, live...)
		defer l.lq.rode(rides)
	}
	// A pipeline holding a write is not retried by go-redis (NoRetry):
	// sent again only while none of it could be written (lua.SendOnce).
	lua.SendOnce(ctx, func() redis.Cmder {
		cmds, _ := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range live {
				switch {
				case c.script == nil:
					c.pub = b.publish(ctx, p, c)
				case c.script.ReadOnly:
					c.res = p.EvalShaRO(ctx, c.script.Hash(), c.keys, c.args...)
				default:
					c.res = c.script.EvalSha(ctx, p, c.keys, c.args...)
				}
			}
			return nil
		})
		return cmds[0]
	})
	for _, c := range live {
		if c.script != nil && lua.IsNoScript(c.res.Err()) {
			b.alone(c)
		}
	}
}

// ScriptRunner runs Lua scripts: a Batcher, or a plain client (Scripts).
type ScriptRunner interface {
	Script(ctx context.Context, s *lua.Script, keys []string, args ...any) *redis.Cmd
}

// Scripts is the ScriptRunner for c: a Batcher over a go-redis client (a
// standalone or cluster client), else c itself, one call per round trip.
func Scripts(c redis.Scripter) ScriptRunner {
	if u, ok := c.(redis.UniversalClient); ok {
		return NewBatcher(u)
	}
	return Direct(c)
}

// Direct is the ScriptRunner that sends each call on its own.
func Direct(c redis.Scripter) ScriptRunner { return directScripts{c} }

type directScripts struct{ c redis.Scripter }

func (d directScripts) Script(ctx context.Context, s *lua.Script, keys []string, args ...any) *redis.Cmd {
	return s.Run(ctx, d.c, keys, args...)
}

// laterLinger is how long a call nobody waits for (ScriptLater,
// PublishLater) waits for others to share its pipeline.
const laterLinger = 2 * time.Millisecond

// laterQueue holds a lane's calls nobody waits for until their pipeline
// goes.
type laterQueue struct {
	mu      sync.Mutex
	calls   []*batchCall
	timer   *time.Timer
	armed   bool // timer will flush the queue
	closed  bool
	flights sync.WaitGroup // pipelines taken from the queue and not yet answered

	// Pipelines go out on long-lived sender goroutines (at most
	// laterSenders per lane, started when first needed, ended by Close): a
	// goroutine started per pipeline grew its stack through go-redis's
	// call depth each time (≈ 10 % of the gateway's CPU at 300 sends/s).
	// A pipeline is handed over only to an idle sender; when every sender
	// is busy it goes out on a goroutine of its own, as many at once as
	// the load needs.
	senders *workers.Pool[[]*batchCall]

	count, rides atomic.Uint64 // LaterStats
}

const laterSenders = 2

// laterRideRoom is the least time a waited-for pipeline must have left for
// the queued later calls to ride on it: a ride shares that pipeline's
// deadline, and a request's short Redis budget must not fail calls that
// could have waited for their own.
const laterRideRoom = 500 * time.Millisecond

// rideRoom reports whether the pipeline of live (waited-for calls) has
// laterRideRoom left: its deadline is their latest (combine.SharedContext).
func rideRoom(live []*batchCall) bool {
	limit := time.Now().Add(laterRideRoom)
	for _, c := range live {
		d, ok := c.ctx.Deadline()
		if !ok || !d.Before(limit) {
			return true
		}
	}
	return false
}

// takeRides removes the queued later calls for a waited-for pipeline; the
// flight it counts ends in rode, once they are answered.
func (q *laterQueue) takeRides() []*batchCall {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.calls) == 0 || q.closed {
		return nil
	}
	calls := q.takeLocked()
	q.flights.Add(1)
	q.rides.Add(uint64(len(calls)))
	return calls
}

// rode hands the rides their replies.
func (q *laterQueue) rode(calls []*batchCall) {
	for _, c := range calls {
		c.done(c)
	}
	q.flights.Done()
}

// LaterStats counts the calls nobody waits for (ScriptLater, PublishLater)
// and those of them that rode on a pipeline of waited-for calls instead of
// one of their own.
type LaterStats struct {
	Calls, Rides uint64
}

// LaterStats returns the counts since the batcher was made.
func (b *Batcher) LaterStats() LaterStats {
	var st LaterStats
	for _, l := range b.allLanes() {
		st.Calls += l.lq.count.Load()
		st.Rides += l.lq.rides.Load()
	}
	return st
}

// ScriptLater queues a script call whose reply nobody waits for (done, if
// not nil, gets it): such calls gather for up to laterLinger and go out in
// one pipeline, or sooner on the next pipeline of waited-for calls, so under
// load one round trip carries many. done runs on the goroutine that sent
// the pipeline, possibly before that pipeline's waiting callers are
// answered: it must be short and must not wait on this batcher. Close sends
// what is queued and waits for it.
func (b *Batcher) ScriptLater(s *lua.Script, keys []string, args []any, done func(*redis.Cmd)) {
	b.later(&batchCall{script: s, keys: keys, args: args, done: func(c *batchCall) {
		if done != nil {
			done(c.res)
		}
	}})
}

// PublishLater is Publish for a caller that does not wait (done, if not
// nil, gets the outcome), batched as ScriptLater.
func (b *Batcher) PublishLater(mode PubSubMode, channel string, payload []byte, done func(error)) {
	sharded, err := ShardedPubSub(b.rdb, mode)
	if err != nil {
		if done != nil {
			done(err)
		}
		return
	}
	b.later(&batchCall{channel: channel, payload: payload, sharded: sharded, done: func(c *batchCall) {
		if done != nil {
			done(c.pub.Err())
		}
	}})
}

// later queues c in its lane (on a cluster, its master's: a call nobody
// waits for rides only on that master's pipelines).
func (b *Batcher) later(c *batchCall) {
	b.laneOf(context.Background(), c).later(c)
}

func (l *lane) later(c *batchCall) {
	q := &l.lq
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		c.ctx = context.Background()
		c.fail(ErrRedisUnavailable)
		c.done(c)
		return
	}
	q.calls = append(q.calls, c)
	q.count.Add(1)
	switch {
	case len(q.calls) >= batchMax:
		calls := q.takeLocked()
		q.flights.Add(1)
		q.mu.Unlock()
		l.flushLater(calls, false)
		return
	case !q.armed:
		q.armed = true
		q.flights.Add(1) // the timer's flush, done by fire or by a successful Stop
		q.timer = time.AfterFunc(laterLinger, func() {
			q.mu.Lock()
			calls := q.takeLocked()
			q.mu.Unlock()
			l.flushLater(calls, true)
		})
	}
	q.mu.Unlock()
}

// flushLater sends calls, a pipeline counted in q.flights, whose count it
// (or the sender it hands them to) marks done once they are answered: on an
// idle sender, on a new one while fewer than laterSenders run, else on this
// goroutine (inline) or a new one.
func (l *lane) flushLater(calls []*batchCall, inline bool) {
	q := &l.lq
	if len(calls) > 0 && q.senders.TryRun(calls) {
		return
	}
	if inline {
		l.sendLater(calls)
		q.flights.Done()
		return
	}
	go func() {
		l.sendLater(calls)
		q.flights.Done()
	}()
}

// takeLocked removes the queued calls and disarms the timer (a timer that
// fires anyway finds nothing, or calls queued since, which it sends early).
func (q *laterQueue) takeLocked() []*batchCall {
	if q.armed && q.timer.Stop() {
		q.flights.Done() // its flush will not run
	}
	q.armed = false
	calls := q.calls
	q.calls = nil
	return calls
}

func (l *lane) sendLater(calls []*batchCall) {
	if len(calls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchSharedBudget)
	defer cancel()
	for _, c := range calls {
		c.ctx = ctx
	}
	l.do(calls...)
	for _, c := range calls {
		c.done(c)
	}
}

// Close sends the calls queued by ScriptLater and PublishLater and waits
// until every such pipeline has been answered; later calls fail at once.
// Calls that wait for their reply are not affected. On a cluster the
// masters' lanes are closed at once, so a stalled master delays only its own.
func (b *Batcher) Close() {
	b.mu.Lock()
	b.closed = true
	lanes := b.allLanes()
	b.mu.Unlock()
	if len(lanes) == 1 {
		lanes[0].close()
		return
	}
	var wg sync.WaitGroup
	for _, l := range lanes {
		wg.Go(l.close)
	}
	wg.Wait()
}

func (l *lane) close() {
	q := &l.lq
	q.mu.Lock()
	q.closed = true
	calls := q.takeLocked()
	q.mu.Unlock()
	l.sendLater(calls)
	// Every hand-over to a sender happens inside a counted flight, so none
	// is left once the flights are done.
	q.flights.Wait()
	q.senders.Close()
}
