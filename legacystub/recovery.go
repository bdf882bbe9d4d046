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

// recoveryBatch is the most tasks one round looks at.
const recoveryBatch = 100

// Recoverer decides stuck tasks: tasks still pending after the poll budget
// (the client stopped polling, or DB2 lost the task or never got it). For
// each one it takes han:coord:lock:safety-recovery:{<task_id>} in DB1 — an
// optimisation that keeps instances off each other's tasks — and then the
// task's PostgreSQL lease, the real guard: only the lease holder may decide
// the task, and only while it is pending, so a task is decided exactly once
// even when the Redis lock is lost or DB1 is down. The verdict is the one
// DB2 already holds, if a poll reached it, else a random one.
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
	r.loop = loop.New(loop.Config{Interval: s.cfg.RecoveryInterval}, func(ctx context.Context) bool {
		_, _ = r.RunOnce(ctx)
		return true
	})
	return r
}

// Start runs a round every RecoveryInterval until Close.
func (r *Recoverer) Start() { r.loop.Start() }

// Close stops the loop and waits for a round in progress. Idempotent.
func (r *Recoverer) Close() { r.loop.Close() }

// RunOnce recovers the stuck tasks it can and returns how many it decided.
func (r *Recoverer) RunOnce(ctx context.Context) (int, error) {
	cfg := r.stub.cfg
	stuck, err := r.stub.store.StuckStubTasks(ctx, cfg.PollBudget(), recoveryBatch)
	if err != nil {
		r.stub.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: list stuck tasks failed", slog.String("kind", store.Kind(err)))
		return 0, err
	}
	n := 0
	var errs []error
	for _, id := range stuck {
		if ctx.Err() != nil {
			break
		}
		ok, err := r.recover(ctx, id)
		if err != nil {
			r.stub.events.WithLabelValues("recovery_failed").Inc()
			r.stub.logger.LogAttrs(ctx, slog.LevelWarn, "legacy stub: recovery failed",
				slog.String("message_id", id), slog.String("kind", store.Kind(err)))
			errs = append(errs, err)
			continue
		}
		if ok {
			n++
			r.stub.events.WithLabelValues("recovered").Inc()
		}
	}
	return n, errors.Join(errs...)
}

// recover decides one task if this recoverer wins it.
func (r *Recoverer) recover(ctx context.Context, id string) (bool, error) {
	cfg := r.stub.cfg
	lctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
	lk, _, err := r.locker.Acquire(lctx, rds.LockSafetyRecovery, id, cfg.RecoveryLease)
	cancel()
	switch {
	case errors.Is(err, rds.ErrLockHeld):
		return false, nil // another instance is on it
	case err != nil:
		// DB1 is unavailable: the lock is only an optimisation, the lease
		// below still guarantees a single decision.
		r.stub.logger.LogAttrs(ctx, slog.LevelDebug, "legacy stub: recovery lock unavailable; relying on the lease",
			slog.String("message_id", id), slog.String("kind", store.Kind(err)))
	default:
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.RedisTimeout)
			_ = lk.Release(rctx)
			cancel()
		}()
	}
	won, err := r.stub.store.LeaseStubTask(ctx, id, r.owner, cfg.RecoveryLease)
	if err != nil || !won {
		return false, err
	}
	if r.afterLease != nil {
		r.afterLease(id)
	}
	verdict := randomVerdict()
	rctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
	st, found, err := store.ReadStubTask(rctx, r.stub.db2, id)
	cancel()
	if err == nil && found && st.State == store.StubDone && (st.Verdict == store.VerdictApproved || st.Verdict == store.VerdictRejected) {
		verdict = st.Verdict // a poll reached it but could not record it
	}
	// A DB2 failure does not stop recovery: the task must be decided within
	// the recovery budget whatever happened to DB2.
	decided, err := r.stub.store.FinishStubRecovery(ctx, id, r.owner, verdict)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = r.stub.store.ReleaseStubLease(rctx, id, r.owner)
		cancel()
		return false, err
	}
	return decided, nil
}
