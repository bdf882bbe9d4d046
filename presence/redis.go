package presence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/internal/workers"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Presence records this instance's connections in Redis DB1, keeps the
// instance's liveness marker fresh, sweeps dead instances and reports
// online/offline transitions. Every method is safe for concurrent use.
type Presence struct {
	cfg    Config
	rdb    redis.UniversalClient
	locker *rds.Locker
	logger *slog.Logger
	events Events

	heartbeatFailures prometheus.Counter
	sweptConns        prometheus.Counter
	sweptInstances    prometheus.Counter

	// markerLapsed: a connect batch or a heartbeat found the liveness
	// marker gone and set it again (survivors may have swept this
	// instance); the liveness loop then registers every connection anew,
	// which its own refresh, finding the marker back, would not.
	markerLapsed atomic.Bool

	mu       sync.Mutex               // guards pending (and their scores), due, checking, offlineRunning, retakes, retakesDropped, checksDropped, emitting, closed, started, cancel
	pending  map[string]*offlineCheck // user → its scheduled offline check
	due      []*offlineCheck          // scheduled checks in due order (cancelled ones skipped)
	checking int                      // checks taken from due whose outcome is not yet reported
	// offlineRunning: the goroutine that runs due checks is running.
	offlineRunning bool
	offlineWake    chan struct{} // wakes that goroutine (Close)
	retakes        []retake      // DisconnectLater's queue, in due order
	retakeCap      int           // bound of retakes (retakeMax; tests lower it)
	// retakesDropped: a removal that failed did not fit in retakes, so
	// nothing takes it again while this instance lives. Sticky: Deregister
	// then leaves the index to the survivors for good.
	retakesDropped bool
	retakeLoop     *loop.Loop // runs while retakes holds entries
	// checksDropped: Close dropped offline checks that had not run (or a
	// failed one it would have retried). Sticky: Deregister then leaves
	// the index, which lists them, to the survivors.
	checksDropped bool
	// emitting holds, for each user whose transition callbacks are
	// running, the callbacks waiting their turn.
	emitting map[string][]func(ctx context.Context)
	emitters *workers.Pool[string] // runs runEmits
	// emitLife bounds the transition callbacks besides their own budget;
	// Shutdown ends it when its context ends.
	emitLife context.Context
	cutEmits context.CancelFunc
	closed   bool
	started  bool
	cancel   context.CancelFunc
	inflight sync.WaitGroup // transition callbacks and loops

	ops opBatcher // connects and disconnects, batched

	// afterSweepDisconnect, when set (by tests), runs between a sweep
	// batch's disconnects and its index removal.
	afterSweepDisconnect func()
}

// New returns a Presence on the DB1 client. events may be nil.
func New(rdb redis.UniversalClient, cfg Config, events Events, logger *slog.Logger) (*Presence, error) {
	if rdb == nil || logger == nil || cfg.InstanceID == "" {
		return nil, errors.New("presence: client, logger and instance id are required")
	}
	cfg.defaults()
	p := &Presence{cfg: cfg, rdb: rdb, locker: rds.NewLocker(rdb), logger: logger, events: events,
		pending: map[string]*offlineCheck{}, offlineWake: make(chan struct{}, 1), retakeCap: retakeMax,
		emitting: map[string][]func(ctx context.Context){},
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_presence_heartbeat_failures_total",
			Help: "Presence heartbeat batches or instance liveness refreshes that failed."}),
		sweptConns: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_presence_swept_connections_total",
			Help: "Connections of dead instances removed by this instance's sweeper."}),
		sweptInstances: prometheus.NewCounter(prometheus.CounterOpts{Name: "han_presence_swept_instances_total",
			Help: "Dead instances fully swept by this instance."}),
	}
	p.emitters = workers.New(emitWorkers, 2*time.Second, p.runEmits)
	p.emitLife, p.cutEmits = context.WithCancel(context.Background())
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{p.heartbeatFailures, p.sweptConns, p.sweptInstances} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	p.ops.p = p
	p.retakeLoop = newRetakeLoop(p)
	p.ops.linger = cfg.Linger
	return p, nil
}

// Config returns the effective configuration (defaults filled in).
func (p *Presence) Config() Config { return p.cfg }

func ms(d time.Duration) int64 { return d.Milliseconds() }

func indexMember(c Conn) string { return c.UserID + ":" + c.ConnID }

// heartbeat registers or refreshes conn under the per-user cap: a
// connection that is not registered is refused when the user already has
// MaxConnsPerUser live connections; a registered one is refreshed whatever
// the count. refresh (the periodic heartbeat of connections already open)
// also skips a connection whose socket has closed since: a refresh sent
// before the disconnect must not register it again.
func (p *Presence) heartbeat(ctx context.Context, c redis.Scripter, conn Conn, refresh bool) *redis.Cmd {
	keys := []string{ConnKey(conn.UserID, conn.ConnID), UserConnsKey(conn.UserID), OnlineKey(conn.UserID)}
	if refresh {
		keys = append(keys, ClosedKey(conn.UserID, conn.ConnID))
	}
	return lua.RTHeartbeat.Run(ctx, c, keys,
		conn.UserID, conn.ConnID, p.cfg.InstanceID, conn.Subscriptions, ms(p.cfg.ConnTTL), ms(p.cfg.UserTTL), p.cfg.StaleBatch, p.cfg.MaxConnsPerUser)
}

func (p *Presence) instanceHeartbeat(ctx context.Context, c redis.Scripter, members []string) *redis.Cmd {
	args := make([]any, 0, 2+len(members))
	args = append(args, ms(p.cfg.LivenessTTL), ms(p.cfg.RegistryTTL))
	for _, m := range members {
		args = append(args, m)
	}
	return lua.RTInstanceHeartbeat.Run(ctx, c, []string{InstanceKey(p.cfg.InstanceID), InstanceConnsKey(p.cfg.InstanceID)}, args...)
}

// ErrTooManyConnections: the user already has MaxConnsPerUser live
// connections; nothing was registered.
var ErrTooManyConnections = errors.New("presence: too many connections for this user")

// Connect registers a new connection: its HASH, its member in the user's
// ZSET and in this instance's index. The check against MaxConnsPerUser and
// the registration are one script, so concurrent connects on any number of
// instances never exceed the cap. A user's first live connection is an
// online transition, reported to Events.
func (p *Presence) Connect(ctx context.Context, c Conn) error {
	// The registration shares a pipeline with other connects and
	// disconnects in flight, and the instance index entry is one command
	// for the batch; a refused registration's entry is taken back.
	op := &presenceOp{kind: opConnect, conn: c}
	if err := p.ops.do(ctx, op); err != nil {
		return fmt.Errorf("presence connect: %w", err)
	}
	v := op.reply
	if len(v) < 4 {
		return fmt.Errorf("presence connect: unexpected reply of %d values", len(v))
	}
	if refused, _ := v[3].(int64); refused == 1 {
		return ErrTooManyConnections
	}
	// The user is back: a pending offline check would find this
	// connection, and the debounce starts again at the next disconnect.
	p.cancelOffline(c.UserID)
	if becameOnline, _ := v[1].(int64); becameOnline == 1 && p.events != nil {
		nowMs, _ := v[0].(int64)
		at := time.UnixMilli(nowMs)
		p.emit(c.UserID, func(ctx context.Context) { p.events.Online(ctx, c.UserID, at) })
	}
	return nil
}

// Refresh runs the heartbeat of every given connection (pipelined) and
// refreshes their members in this instance's index. A connection that is
// no longer registered (survivors swept it while this instance looked dead)
// is registered again only within the per-user cap; the ones the cap
// refuses are handed to Config.Refused, whose sockets should close.
func (p *Presence) Refresh(ctx context.Context, conns []Conn) error {
	const chunk = 500
	for len(conns) > 0 {
		n := min(len(conns), chunk)
		batch := conns[:n]
		conns = conns[n:]
		members := make([]string, len(batch))
		for i, c := range batch {
			members[i] = indexMember(c)
		}
		cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
			for _, c := range batch {
				p.heartbeat(ctx, pipe, c, true)
			}
			p.instanceHeartbeat(ctx, pipe, members)
		})
		if err != nil {
			p.heartbeatFailures.Inc()
			return fmt.Errorf("presence refresh: %w", rds.ClassifyRedisError(err))
		}
		var unlisted []string // closed or refused: not in the index
		var refused []Conn
		for i, c := range batch {
			if v, err := lua.Reply(cmds[i]).Slice(); err == nil && len(v) > 3 {
				switch skipped, _ := v[3].(int64); skipped {
				case 1:
					refused = append(refused, c)
					unlisted = append(unlisted, indexMember(c))
				case 2:
					unlisted = append(unlisted, indexMember(c))
				}
				if became, _ := v[1].(int64); became == 1 && p.events != nil {
					user := c.UserID
					nowMs, _ := v[0].(int64)
					at := time.UnixMilli(nowMs)
					p.emit(user, func(ctx context.Context) { p.events.Online(ctx, user, at) })
				}
			}
		}
		p.noteMarker(cmds[len(cmds)-1])
		if len(unlisted) > 0 {
			// The batch's index update listed them again.
			if err := p.rdb.ZRem(ctx, InstanceConnsKey(p.cfg.InstanceID), toAny(unlisted)...).Err(); err != nil {
				p.logger.Warn("presence: removing unregistered connections' index entries failed", slog.String("kind", rds.Kind(err)))
			}
		}
		if len(refused) > 0 && p.cfg.Refused != nil {
			p.cfg.Refused(refused)
		}
	}
	return nil
}

// Disconnect removes a connection; a duplicate call is harmless. When the
// user has no live connection left, the offline transition is checked
// after OfflineDebounce. It returns the time Redis recorded, or the zero
// time when Redis recorded none (the caller then records no last-seen
// time: this instance's clock may be ahead, and a last-seen time only
// moves forward; the offline check's own Redis time is recorded when the
// user goes offline). A removal that gets no answer is done again later,
// as DisconnectLater does, and the offline check follows that removal (or,
// should Redis not answer for ConnTTL, the connection going stale).
func (p *Presence) Disconnect(ctx context.Context, userID, connID string) (time.Time, error) {
	op := &presenceOp{kind: opDisconnect, conn: Conn{UserID: userID, ConnID: connID}}
	if err := p.ops.do(ctx, op); err != nil {
		p.removalFailed([]Conn{op.conn})
		return time.Time{}, fmt.Errorf("presence disconnect: %w", err)
	}
	return p.afterDisconnect(userID, op.reply, op.score), nil
}

// disconnect removes a connection. closed marks its socket closed (for
// ConnTTL), so that no periodic heartbeat already under way registers it
// again; a sweep does not mark it, since the swept instance may come back
// and register its open sockets again.
func (p *Presence) disconnect(ctx context.Context, c redis.Scripter, userID, connID string, closed bool, fresh ...int64) *redis.Cmd {
	keys := []string{ConnKey(userID, connID), UserConnsKey(userID)}
	if closed {
		keys = append(keys, ClosedKey(userID, connID))
	}
	args := []any{connID, ms(p.cfg.ConnTTL), p.cfg.StaleBatch}
	for _, f := range fresh {
		args = append(args, f)
	}
	return lua.RTDisconnect.Run(ctx, c, keys, args...)
}

// afterDisconnect reads a removal's reply: it schedules the user's offline
// check (score: its member's in this instance's index, 0 for none) when no
// live connection is left and returns Redis's time of the removal (zero
// when the reply carried none).
func (p *Presence) afterDisconnect(userID string, v []any, score int64) time.Time {
	live, at, ok := removalReply(v)
	if ok && live == 0 {
		p.scheduleOffline(userID, at, score)
	}
	return at
}

// removalReply reads a removal's reply: the user's live connections left
// and Redis's time of the removal; ok is false when it carried none.
func removalReply(v []any) (live int64, at time.Time, ok bool) {
	if len(v) < 3 {
		return 0, time.Time{}, false
	}
	live, _ = v[1].(int64)
	nowMs, _ := v[2].(int64)
	return live, time.UnixMilli(nowMs), true
}

// MarkOffline reports the offline transition once: true when the user has
// no live connection and its online marker was still set (it is deleted).
func (p *Presence) MarkOffline(ctx context.Context, userID string) (bool, error) {
	v, err := lua.RTOffline.Run(ctx, p.rdb, []string{UserConnsKey(userID), OnlineKey(userID)}, ms(p.cfg.ConnTTL)).Slice()
	if err != nil {
		return false, fmt.Errorf("presence offline: %w", rds.ClassifyRedisError(err))
	}
	went, _ := v[0].(int64)
	return went == 1, nil
}

// Online returns the number of live connections of the user.
func (p *Presence) Online(ctx context.Context, userID string) (int, error) {
	n, _, err := p.online(ctx, userID)
	return n, err
}

// online is Online that also returns Redis's time of the count (zero when
// the reply carried none): a transition announced from the count is
// stamped with it, never with this instance's clock.
func (p *Presence) online(ctx context.Context, userID string) (int, time.Time, error) {
	v, err := lua.RTPresence.Run(ctx, p.rdb, []string{UserConnsKey(userID)}, ms(p.cfg.ConnTTL)).Slice()
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("presence: %w", rds.ClassifyRedisError(err))
	}
	var n int64
	if len(v) > 0 {
		n, _ = v[0].(int64)
	}
	var at time.Time
	if len(v) > 1 {
		if nowMs, ok := v[1].(int64); ok {
			at = time.UnixMilli(nowMs)
		}
	}
	return int(n), at, nil
}

// RefreshLiveness refreshes this instance's marker and registry entry.
// lapsed reports that the marker had expired (survivors may have swept this
// instance's connections: the caller re-registers them).
func (p *Presence) RefreshLiveness(ctx context.Context) (lapsed bool, err error) {
	cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		p.instanceHeartbeat(ctx, pipe, nil)
		lua.RTInstancesAdd.Run(ctx, pipe, []string{InstancesKey}, p.cfg.InstanceID, ms(p.cfg.RegistryTTL))
	})
	if err != nil {
		p.heartbeatFailures.Inc()
		return false, fmt.Errorf("presence liveness: %w", rds.ClassifyRedisError(err))
	}
	v, _ := lua.Reply(cmds[0]).Slice()
	present := int64(1)
	if len(v) > 1 {
		present, _ = v[1].(int64)
	}
	return present == 0, nil
}

// noteMarker reads an instance heartbeat's reply: a marker that was not
// there is a lapse for the liveness loop to act on.
func (p *Presence) noteMarker(cmd redis.Cmder) {
	if v, err := lua.Reply(cmd).Slice(); err == nil && len(v) > 1 {
		if present, _ := v[1].(int64); present == 0 {
			p.markerLapsed.Store(true)
		}
	}
}

// Deregister removes this instance's marker, index and registry entry
// (graceful shutdown, after its connections disconnected). While removals
// that failed still wait to be taken again (DisconnectLater), or once one
// did not fit in that queue (it will never be taken again), or once Close
// dropped offline checks that had not run, only the marker goes: the index
// lists those connections and checks, and the survivors, who find the
// marker gone, sweep them and announce their users offline — a shutdown
// cannot promise to outlive the retry.
//
// Offline checks still pending (a drain's, which run while Shutdown
// waits) are handed on: the index is left holding one "~offline" member
// for each and nothing else, with the registry entry, so that should the
// instance die before they run, the survivors run them; each check run
// here takes its member back, and a survivor's sweep of what is left
// removes the entry.
func (p *Presence) Deregister(ctx context.Context) error {
	p.mu.Lock()
	outstanding := len(p.retakes) > 0 || p.retakesDropped || p.checksDropped
	users := make([]string, 0, len(p.pending))
	for u := range p.pending {
		users = append(users, u)
	}
	p.mu.Unlock()
	index := InstanceConnsKey(p.cfg.InstanceID)
	var listed *redis.Cmd
	_, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		if !outstanding {
			pipe.Del(ctx, index)
			if len(users) > 0 {
				// The marker goes after it: a sweep between sees an
				// instance still alive.
				listed = p.listOffline(ctx, pipe, users, nil)
			} else {
				pipe.ZRem(ctx, InstancesKey, p.cfg.InstanceID)
			}
		}
		pipe.Del(ctx, InstanceKey(p.cfg.InstanceID))
	})
	if err == nil && listed != nil {
		score, _ := lua.Reply(listed).Int64()
		p.adopt(users, score)
	}
	return rds.ClassifyRedisError(err)
}

// SweepResult counts what one sweep removed.
type SweepResult struct {
	Instances   int // dead instances whose index is now empty
	Connections int // connections removed
}

// Sweep looks for instances whose liveness marker expired and removes
// their connections: per-user single-slot disconnect scripts, then an
// idempotent removal from the dead instance's index, in bounded batches.
// A per-instance coordination lock keeps survivors from doing the same work
// twice; doing it twice would be harmless.
func (p *Presence) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	ids, err := p.rdb.ZRange(ctx, InstancesKey, 0, -1).Result()
	if err != nil {
		return res, fmt.Errorf("presence sweep: %w", rds.ClassifyRedisError(err))
	}
	for _, id := range ids {
		if id == p.cfg.InstanceID || strings.ContainsAny(id, "{}: ") {
			continue
		}
		alive, err := p.rdb.Exists(ctx, InstanceKey(id)).Result()
		if err != nil {
			return res, fmt.Errorf("presence sweep: %w", rds.ClassifyRedisError(err))
		}
		if alive == 1 {
			continue
		}
		n, swept, err := p.sweepDead(ctx, id)
		res.Connections += n
		if swept {
			res.Instances++
		}
		if err != nil {
			return res, fmt.Errorf("presence sweep: %w", err)
		}
	}
	return res, nil
}

// sweepBudget bounds one round of the sweeper (the sweep loop's timeout)
// and is the lifetime of the lock a survivor holds while it sweeps one
// dead instance. The lock only saves duplicate work, but while it stands
// no other survivor sweeps that instance: a survivor that dies or stalls
// in the middle of a sweep must hold the others back for about one sweep
// interval, not for the 30 s of the other coordination locks, or the dead
// instance's users would stay online well past liveness TTL + sweep
// interval.
func (p *Presence) sweepBudget() time.Duration { return max(p.cfg.SweepInterval, time.Second) }

// sweepDead sweeps one dead instance under its sweep lock (skipped when
// another survivor holds it): n connections removed; swept reports that
// its index is empty and its registry entry gone. The sweep ends when the
// lock would expire (what is left waits for the next round, which takes
// the lock again), so it never runs on without the lock: a large index is
// swept over several rounds.
func (p *Presence) sweepDead(parent context.Context, id string) (n int, swept bool, err error) {
	// The deadline starts before the lock is taken, so it passes before
	// the lock expires.
	ctx, cancel := context.WithTimeout(parent, p.sweepBudget())
	defer cancel()
	defer func() {
		// The sweep's own budget ending is no failure: the next round goes
		// on where this one stopped, and the other dead instances of this
		// round are still swept.
		if err != nil && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = nil
		}
	}()
	lk, _, err := p.locker.Acquire(ctx, rds.LockPresenceSweep, id, p.sweepBudget())
	if errors.Is(err, rds.ErrLockHeld) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = lk.Release(context.WithoutCancel(ctx)) }()
	n, done, err := p.sweepInstance(ctx, id, 50, true)
	if err == nil && done {
		// Only now: a crash before this line leaves the entry for the
		// next sweep, which finds an empty index and finishes.
		err = p.rdb.ZRem(ctx, InstancesKey, id).Err()
		if err == nil {
			swept = true
			p.sweptInstances.Inc()
		}
	}
	return n, swept, rds.ClassifyRedisError(err)
}

// sweepInstance removes up to maxBatches batches of an instance's indexed
// connections; done reports that its index is empty.
//
// The instance may come back while it is swept (a long pause, not a
// crash): it sets its marker again and registers every connection anew.
// Those registrations must survive the sweep, so a connection whose
// heartbeat is younger than half the liveness TTL is spared (a dead
// instance's last heartbeat is older than that when its marker has
// expired), and an index entry is removed only if its score is still the
// one the sweep read. A batch that spared anything ends this sweep of the
// instance, and so does its marker being back before the next batch (it
// sets the marker before it registers its connections again, a chunk at a
// time): the next sweep looks at the marker again. spareFresh is false for
// an earlier life of this instance's own id, which cannot come back.
//
// The offline checks the instance had not run yet (its "~offline"
// members) and those of the users its removed connections leave with none
// live are listed in this instance's index before the swept entries go,
// then scheduled here: should this instance die too, whoever sweeps it
// runs them. In an earlier life's index, which is this life's own, listing
// a check moves its member past the entries the sweep reads (those older
// than the sweep).
func (p *Presence) sweepInstance(ctx context.Context, id string, maxBatches int, spareFresh bool) (n int, done bool, err error) {
	index := InstanceConnsKey(id)
	var fresh []int64
	until := "+inf"
	if spareFresh {
		fresh = []int64{ms(p.cfg.LivenessTTL / 2)}
	} else {
		// Redis's time on the index's own node: what this life lists
		// from now on is not older.
		start, err := p.listOffline(ctx, p.rdb, nil, nil).Int64()
		if err != nil {
			return 0, false, err
		}
		until = "(" + strconv.FormatInt(start, 10)
	}
	for b := 0; b < maxBatches; b++ {
		if b > 0 && spareFresh {
			if back, err := p.rdb.Exists(ctx, InstanceKey(id)).Result(); err != nil || back == 1 {
				return n, false, err
			}
		}
		entries, err := p.rdb.ZRangeByScoreWithScores(ctx, index, &redis.ZRangeBy{Min: "-inf", Max: until, Count: int64(p.cfg.SweepBatch)}).Result()
		if err != nil {
			return n, false, err
		}
		if len(entries) == 0 {
			return n, true, nil
		}
		removed, args, spared, err := p.sweepBatch(ctx, entries, fresh, spareFresh)
		n += removed
		if err != nil {
			return n, false, err
		}
		if p.afterSweepDisconnect != nil {
			p.afterSweepDisconnect()
		}
		gone := 0
		if len(args) > 0 {
			gone, err = lua.RTIndexRemove.Run(ctx, p.rdb, []string{index}, args...).Int()
			if err != nil {
				return n, false, err
			}
		}
		p.sweptConns.Add(float64(removed))
		if spared || gone < len(args)/2 {
			return n, false, nil
		}
	}
	return n, false, nil
}

// sweepBatch removes one batch of a swept index's connections and takes
// over the offline checks the batch leads to (sweepInstance). It returns
// how many connections it removed, the entries to take out of the index
// (member, score read) and whether it spared a fresh registration.
func (p *Presence) sweepBatch(ctx context.Context, entries []redis.Z, fresh []int64, other bool) (n int, args []any, spared bool, err error) {
	type target struct{ user, conn, member, score string }
	var conns []target
	checks := map[string]time.Time{} // user → the transition's time
	var users []string
	check := func(u string, at time.Time) {
		if _, ok := checks[u]; !ok {
			users = append(users, u)
		}
		if at.After(checks[u]) {
			checks[u] = at
		}
	}
	args = make([]any, 0, 2*len(entries))
	for _, e := range entries {
		m, _ := e.Member.(string)
		score := strconv.FormatInt(int64(e.Score), 10)
		u, c, ok := strings.Cut(m, ":")
		switch {
		case !ok:
		case c == offlineConnID:
			check(u, time.UnixMilli(int64(e.Score)))
			if other {
				args = append(args, m, score)
			}
		default:
			conns = append(conns, target{u, c, m, score})
		}
	}
	if len(conns) > 0 {
		cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
			for _, t := range conns {
				p.disconnect(ctx, pipe, t.user, t.conn, false, fresh...)
			}
		})
		if err != nil {
			return 0, nil, false, err
		}
		for i, t := range conns {
			v, _ := lua.Reply(cmds[i]).Slice()
			if len(v) > 0 {
				if removed, _ := v[0].(int64); removed < 0 {
					spared = true
					continue
				}
			}
			if live, at, ok := removalReply(v); ok && live == 0 {
				check(t.user, at)
			}
			args = append(args, t.member, t.score)
			n++
		}
	}
	if len(users) > 0 {
		score, err := p.listOffline(ctx, p.rdb, users, nil).Int64()
		if err != nil {
			return n, nil, spared, err
		}
		for _, u := range users {
			p.scheduleOffline(u, checks[u], score)
		}
	}
	return n, args, spared, nil
}

// pipelined runs fn's commands in one pipeline. Scripts queued in a
// pipeline run as EVALSHA without the NOSCRIPT fallback, so after a Redis
// restart or SCRIPT FLUSH the scripts are loaded and the commands Redis
// refused with NOSCRIPT, and only those, are sent once more: the others
// ran (another call's reload had loaded their scripts already), and a
// script run twice answers differently the second time (a registration
// would find its user online already, and the online transition would
// never be announced).
func (p *Presence) pipelined(ctx context.Context, fn func(pipe redis.Pipeliner)) ([]redis.Cmder, error) {
	cmds, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		fn(pipe)
		return nil
	})
	if err == nil || !hasNoScript(cmds) {
		return cmds, err
	}
	for _, s := range []*lua.Script{lua.RTHeartbeat, lua.RTDisconnect, lua.RTDisconnectUser, lua.RTOffline, lua.RTInstanceHeartbeat, lua.RTInstancesAdd, lua.RTIndexRemove, lua.RTIndexUpdate} {
		if err := s.Load(ctx, p.rdb); err != nil {
			return cmds, err
		}
	}
	var again []redis.Cmder
	for _, c := range cmds {
		if lua.IsNoScript(c.Err()) {
			again = append(again, c)
		}
	}
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range again {
			_ = pipe.Process(ctx, c)
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}

func hasNoScript(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if lua.IsNoScript(c.Err()) {
			return true
		}
	}
	return false
}
