package legacystub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// recoveryBatch is the most tasks one round claims.
const recoveryBatch = 100

// maxRoundsPerTick bounds the rounds of one tick, so a tick cannot run
// forever when tasks become stuck as fast as it decides them: with a full
// batch every round, one instance decides at most
// maxRoundsPerTick × recoveryBatch tasks per RecoveryInterval.
const maxRoundsPerTick = 100

// Recoverer decides stuck tasks: tasks still pending after the poll budget
// (the client stopped polling, or DB2 lost the task or never got it). A
// round claims a batch of them, taking each one's PostgreSQL lease in the
// same statement that lists them (rows another instance is claiming are
// skipped), so instances share the backlog instead of all working on the
// same oldest tasks. For each claimed task it then takes
// han:coord:lock:safety-recovery:{<task_id>} in DB1 and decides the task.
// The lease is the real guard: only the lease holder may decide the task,
// and only while it is pending, so a task is decided exactly once even when
// the Redis lock is lost or DB1 is down. The verdict is the one DB2 already
// holds, if a poll reached it, else a random one.
type Recoverer struct {
	stub   *Stub
	locker *rds.Locker
	owner  string // lease owner: instance id + random suffix, unique per process

	afterLease func(taskID string) // test hook: runs while the lease is held

	loop *loop.Loop
}

// NewRecoverer builds a stopped Recoverer. db1 is the DB1 client (api_backend)
// that holds han:coord:* locks; instanceID names this instance in leases.
func (s *Stub) NewRecoverer(db1 redis.Scripter, instanceID string) *Recoverer {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	r := &Recoverer{stub: s, locker: rds.NewLocker(db1), owner: instanceID + "-" + hex.EncodeToString(b)}
	// A tick starts no round after RecoveryInterval; the timeout leaves the
	// last one a lease's time to finish, and cuts a round that PostgreSQL
	// holds longer (its unfinished leases are given back).
	cfg := s.cfg
	r.loop = loop.New(loop.Config{Interval: cfg.RecoveryInterval, Timeout: cfg.RecoveryInterval + cfg.RecoveryLease},
		func(ctx context.Context) bool {
			r.runTick(ctx)
			return true
		})
	return r
}

// Start runs a tick every RecoveryInterval until Close.
func (r *Recoverer) Start() { r.loop.Start() }

// Close stops the loop and waits for a round in progress. Idempotent.
func (r *Recoverer) Close() { r.loop.Close() }

// runTick runs rounds until the backlog is gone: another round follows as
// long as the previous one claimed a full batch without an error, within
// RecoveryInterval and maxRoundsPerTick rounds. One round per tick would cap
// an instance at recoveryBatch tasks per RecoveryInterval, and tasks that
// become stuck faster than that would pile up past the recovery budget. It
// returns how many tasks the tick decided.
func (r *Recoverer) runTick(ctx context.Context) int {
	start := time.Now()
	total := 0
	for range maxRoundsPerTick {
		n, claimed, err := r.runRound(ctx)
		total += n
		if err != nil || claimed < recoveryBatch || ctx.Err() != nil || time.Since(start) >= r.stub.cfg.RecoveryInterval {
			break
		}
	}
	return total
}

// RunOnce runs one round: it claims up to recoveryBatch stuck tasks,
// decides those it can and returns how many it decided.
//
// A round stays within its budget whatever Redis does: DB2 is read once for
// the whole batch (one pipeline under one RedisTimeout), and the DB1 lock is
// given up for the rest of the round after its first failure, so a stalled
// Redis costs a round a few RedisTimeouts, not one per task. Without DB2 the
// verdicts are drawn at random, without DB1 the lease alone guards, as when
// either is down.
func (r *Recoverer) RunOnce(ctx context.Context) (int, error) {
	n, _, err := r.runRound(ctx)
	return n, err
}

// runRound is RunOnce, also reporting how many tasks it claimed.
func (r *Recoverer) runRound(ctx context.Context) (decided, claimed int, err error) {
	cfg := r.stub.cfg
	stuck, err := r.stub.store.ClaimStuckStubTasks(ctx, cfg.PollBudget(), r.owner, cfg.RecoveryLease, recoveryBatch)
	if err != nil {
		r.stub.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: claim stuck tasks failed", slog.String("kind", store.Kind(err)))
		return 0, 0, err
	}
	rd := &round{db2: r.readDB2(ctx, stuck)}
	var errs []error
	for i, id := range stuck {
		if ctx.Err() != nil {
			// Cut short (Close, or the tick's timeout): the tasks not
			// reached go back now rather than when their leases expire.
			r.giveBack(ctx, stuck[i:])
			break
		}
		ok, err := r.recover(ctx, rd, id)
		if err != nil {
			r.stub.events.WithLabelValues("recovery_failed").Inc()
			r.stub.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: recovery failed",
				slog.String("message_id", id), slog.String("kind", store.Kind(err)))
			errs = append(errs, err)
			continue
		}
		if ok {
			decided++
			r.stub.events.WithLabelValues("recovered").Inc()
		}
	}
	return decided, len(stuck), errors.Join(errs...)
}

// giveBack releases this recoverer's leases of tasks it will not decide, so
// the next round (of any instance) need not wait for them to expire. It
// runs even when ctx is done.
func (r *Recoverer) giveBack(ctx context.Context, ids []string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = r.stub.store.ReleaseStubLeases(rctx, ids, r.owner)
}

// round is what one round learnt about its dependencies.
type round struct {
	db2     map[string]store.StubTaskState // the tasks DB2 holds; nil when DB2 failed
	db1Down bool                           // DB1 failed once: no more locks this round
}

// readDB2 reads the batch's tasks from DB2 in one round trip. A failure
// leaves every verdict to chance, as when DB2 lost the tasks.
func (r *Recoverer) readDB2(ctx context.Context, ids []string) map[string]store.StubTaskState {
	if len(ids) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.stub.cfg.RedisTimeout)
	defer cancel()
	states, err := store.ReadStubTasks(rctx, r.stub.db2, ids)
	if err != nil {
		r.stub.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: DB2 unavailable; recovery draws the verdicts",
			slog.Int("tasks", len(ids)), slog.String("kind", store.Kind(err)))
		return nil
	}
	return states
}

// lock takes the task's recovery lock in DB1 unless DB1 already failed this
// round. elsewhere is true when another instance holds it; release is nil
// when no lock was taken (the lease alone guards then).
func (r *Recoverer) lock(ctx context.Context, rd *round, id string) (elsewhere bool, release func()) {
	if rd.db1Down {
		return false, nil
	}
	cfg := r.stub.cfg
	lctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
	lk, _, err := r.locker.Acquire(lctx, rds.LockSafetyRecovery, id, cfg.RecoveryLease)
	cancel()
	switch {
	case errors.Is(err, rds.ErrLockHeld):
		return true, nil // another instance is on it
	case err != nil:
		// DB1 is unavailable: the lock is only an optimisation, the lease
		// still guarantees a single decision.
		rd.db1Down = true
		r.stub.logger.LogAttrs(ctx, slog.LevelDebug, "legacy stub: recovery lock unavailable; relying on the lease",
			slog.String("message_id", id), slog.String("kind", store.Kind(err)))
		return false, nil
	}
	return false, func() {
		if rd.db1Down {
			return // left to expire: DB1 stalled since
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.RedisTimeout)
		if err := lk.Release(rctx); err != nil && !errors.Is(err, rds.ErrLockLost) && !errors.Is(err, rds.ErrLockExpired) {
			rd.db1Down = true
		}
		cancel()
	}
}

// recover decides one claimed task unless another instance holds its lock.
func (r *Recoverer) recover(ctx context.Context, rd *round, id string) (bool, error) {
	elsewhere, release := r.lock(ctx, rd, id)
	if elsewhere {
		r.giveBack(ctx, []string{id})
		return false, nil
	}
	if release != nil {
		defer release()
	}
	if r.afterLease != nil {
		r.afterLease(id)
	}
	verdict := randomVerdict()
	if st, ok := rd.db2[id]; ok && st.State == store.StubDone && (st.Verdict == store.VerdictApproved || st.Verdict == store.VerdictRejected) {
		verdict = st.Verdict // a poll reached it but could not record it
	}
	// A DB2 failure does not stop recovery: the task must be decided within
	// the recovery budget whatever happened to DB2.
	decided, err := r.stub.store.FinishStubRecovery(ctx, id, r.owner, verdict)
	if err != nil {
		r.giveBack(ctx, []string{id})
		return false, err
	}
	return decided, nil
}
