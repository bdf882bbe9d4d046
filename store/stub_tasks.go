package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Legacy DB2 safety stub data (docs/legacy-stub.md):
// the task HASH in DB2, reached only as ACL user legacy_stub, and the
// stub_tasks row in PostgreSQL, written in the message's send transaction,
// which holds the durable verdict and the recovery lease. The task id is the
// message id.

// Task states and verdicts (the same words in Redis and PostgreSQL).
const (
	StubPending     = "pending"
	StubDone        = "done"
	VerdictApproved = "approved"
	VerdictRejected = "rejected"
)

// Who decided a task.
const (
	DecidedByPoll     = "poll"
	DecidedByRecovery = "recovery"
)

// StubKeyPattern matches every key of the legacy stub (cutover deletes them).
const StubKeyPattern = "han:stub:*"

// ErrStubTaskNotFound: the message has no safety task (sent while the stub
// was off).
var ErrStubTaskNotFound = errors.New("store: safety task not found")

// StubTaskKey is han:stub:task:{<task_id>} in DB2.
func StubTaskKey(taskID string) string { return "han:stub:task:{" + taskID + "}" }

// StubTask is the durable row of a task.
type StubTask struct {
	MessageID  string
	State      string // StubPending or StubDone
	Verdict    string // "" while pending
	DecidedBy  string // DecidedByPoll, DecidedByRecovery or ""
	CreatedAt  time.Time
	Recoveries int
}

const stubTaskColumns = `message_id::text, state, COALESCE(verdict, ''), COALESCE(decided_by, ''), created_at, recoveries`

func scanStubTask(row pgx.Row) (StubTask, error) {
	var t StubTask
	err := row.Scan(&t.MessageID, &t.State, &t.Verdict, &t.DecidedBy, &t.CreatedAt, &t.Recoveries)
	return t, err
}

// StubTask loads a message's task (ErrStubTaskNotFound when it has none).
// It serves request paths (the safety poll, send replays): the statement is
// bounded by the request budget, and a lock that holds it longer comes back
// as ErrDatabaseBusy.
func (s *Store) StubTask(ctx context.Context, messageID string) (StubTask, error) {
	t, err := scanStubTask(s.reqQueryRow(ctx, `SELECT `+stubTaskColumns+` FROM stub_tasks WHERE message_id=$1`, messageID))
	if errors.Is(err, pgx.ErrNoRows) {
		return StubTask{}, ErrStubTaskNotFound
	}
	if err != nil {
		return StubTask{}, fmt.Errorf("load safety task: %w", err)
	}
	return t, nil
}

// DecideStubTask records the verdict a poll reached, if the task is still
// pending, and returns the task as decided: a task decided earlier (by
// another poll or by recovery) keeps its verdict, which is the one returned
// (decided is false then). Like StubTask it is bounded by the request
// budget (ErrDatabaseBusy when a lock holds it longer).
func (s *Store) DecideStubTask(ctx context.Context, messageID, verdict string) (t StubTask, decided bool, err error) {
	t, err = scanStubTask(s.reqQueryRow(ctx, `UPDATE stub_tasks SET state='done', verdict=$2, decided_by='poll',
		decided_at=now(), lease_owner=NULL, lease_until=NULL
		WHERE message_id=$1 AND state='pending' RETURNING `+stubTaskColumns, messageID, verdict))
	if errors.Is(err, pgx.ErrNoRows) {
		t, err = s.StubTask(ctx, messageID)
		return t, false, err
	}
	if err != nil {
		return StubTask{}, false, fmt.Errorf("decide safety task: %w", err)
	}
	return t, true, nil
}

// ClaimStuckStubTasks takes the recovery lease, for owner, of up to limit
// tasks pending for longer than olderThan whose lease is free or expired,
// oldest first, and returns their ids. Listing and leasing are one
// statement, and rows another claimer has locked are skipped (FOR UPDATE
// SKIP LOCKED), so recoverers running at the same time claim different
// tasks instead of all listing the same oldest ones and then colliding on
// each. The lease, not the Redis lock, is what stops two recoverers
// deciding one task.
func (s *Store) ClaimStuckStubTasks(ctx context.Context, olderThan time.Duration, owner string, lease time.Duration, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `WITH claim AS (SELECT message_id FROM stub_tasks
			WHERE state='pending' AND created_at < now() - make_interval(secs => $1)
			AND (lease_until IS NULL OR lease_until < now())
			ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		UPDATE stub_tasks t SET lease_owner=$3, lease_until=now() + make_interval(secs => $4)
		FROM claim WHERE t.message_id = claim.message_id
		RETURNING t.message_id::text, t.created_at`, olderThan.Seconds(), limit, owner, lease.Seconds())
	if err != nil {
		return nil, fmt.Errorf("claim stuck safety tasks: %w", err)
	}
	type claimed struct {
		id      string
		created time.Time
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := row.Scan(&c.id, &c.created)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim stuck safety tasks: %w", err)
	}
	// RETURNING keeps no order: the oldest are decided first.
	slices.SortFunc(got, func(a, b claimed) int { return a.created.Compare(b.created) })
	out := make([]string, len(got))
	for i, c := range got {
		out[i] = c.id
	}
	return out, nil
}

// FinishStubRecovery decides a task that owner recovered: only while the
// task is pending and owner still holds its lease (nobody took it over after
// it expired). It reports whether this call decided the task.
func (s *Store) FinishStubRecovery(ctx context.Context, messageID, owner, verdict string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE stub_tasks SET state='done', verdict=$3, decided_by='recovery', decided_at=now(),
		recoveries = recoveries + 1, lease_owner=NULL, lease_until=NULL
		WHERE message_id=$1 AND state='pending' AND lease_owner=$2`, messageID, owner, verdict)
	if err != nil {
		return false, fmt.Errorf("finish safety recovery: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseStubLeases gives owner's leases of the given tasks back early
// (recoveries that could not finish, or claimed tasks a round did not reach),
// so the next round need not wait for them to expire.
func (s *Store) ReleaseStubLeases(ctx context.Context, messageIDs []string, owner string) error {
	if len(messageIDs) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE stub_tasks SET lease_owner=NULL, lease_until=NULL
		WHERE message_id = ANY($1::uuid[]) AND lease_owner=$2`, messageIDs, owner); err != nil {
		return fmt.Errorf("release safety leases: %w", err)
	}
	return nil
}

// StubTaskState is a task as DB2 holds it.
type StubTaskState struct {
	State     string
	Polls     int64
	Verdict   string
	CreatedMs int64
}

// CreateStubTask writes a pending task with its TTL in DB2 (rdb connects
// as legacy_stub). created is false when it already existed.
func CreateStubTask(ctx context.Context, rdb redis.Scripter, taskID string, ttl time.Duration) (created bool, err error) {
	v, err := lua.StubTaskCreate.Run(ctx, rdb, []string{StubTaskKey(taskID)}, ttl.Milliseconds()).Slice()
	if err != nil {
		return false, fmt.Errorf("create safety task: %w", rds.ClassifyRedisError(err))
	}
	n, _ := v[0].(int64)
	return n == 1, nil
}

// PollStubTask counts one poll of a task and returns its state after it;
// the poll that reaches verdictAfter polls records verdict. found is false
// when DB2 holds no such task.
func PollStubTask(ctx context.Context, rdb redis.Scripter, taskID string, verdictAfter int, verdict string) (st StubTaskState, found bool, err error) {
	v, err := lua.StubTaskPoll.Run(ctx, rdb, []string{StubTaskKey(taskID)}, verdictAfter, verdict).Slice()
	if errors.Is(err, redis.Nil) {
		return StubTaskState{}, false, nil
	}
	if err != nil {
		return StubTaskState{}, false, fmt.Errorf("poll safety task: %w", rds.ClassifyRedisError(err))
	}
	if len(v) < 4 {
		return StubTaskState{}, false, errors.New("store: poll safety task: unexpected reply")
	}
	st.State, _ = v[0].(string)
	st.Polls, _ = v[1].(int64)
	st.Verdict, _ = v[2].(string)
	st.CreatedMs, _ = v[3].(int64)
	return st, true, nil
}

// ReadStubTasks reads many tasks without counting a poll (recovery): one
// pipeline, one round trip, so a stalled DB2 costs the caller's deadline
// once, not once per task. The map holds the tasks DB2 has.
func ReadStubTasks(ctx context.Context, rdb redis.Cmdable, taskIDs []string) (map[string]StubTaskState, error) {
	out := make(map[string]StubTaskState, len(taskIDs))
	if len(taskIDs) == 0 {
		return out, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(taskIDs))
	for i, id := range taskIDs {
		cmds[i] = pipe.HMGet(ctx, StubTaskKey(id), "state", "verdict")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read safety tasks: %w", rds.ClassifyRedisError(err))
	}
	for i, c := range cmds {
		v := c.Val()
		if len(v) < 2 {
			continue
		}
		if state, _ := v[0].(string); state != "" {
			verdict, _ := v[1].(string)
			out[taskIDs[i]] = StubTaskState{State: state, Verdict: verdict}
		}
	}
	return out, nil
}
