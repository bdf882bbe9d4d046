package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store/rds"
)

// RelayOutbox (the pubsub.Outbox of the relay) claims up to limit undelivered outbox rows older than grace
// with FOR UPDATE SKIP LOCKED (so concurrent relays on other instances
// never take the same row at the same time) and calls publish for each in
// id order. In the same transaction it marks the rows publish succeeded on
// as delivered. A publish error wrapping rds.ErrLockHeld or
// pubsub.ErrRowDeferred skips that row (another deliverer holds it; its
// Redis node failed, which charges nothing: the row is not to blame); one
// wrapping pubsub.ErrRowRefusedAlone (the server of the row's slot took a
// probe right after refusing the row) skips it and charges it an attempt;
// a row whose frame cannot be built is charged without a publish. Rows at
// pubsub.OutboxMaxAttempts are not claimed again (given up). Any other
// error ends the batch: the rest stay untouched for the next run, and
// nothing is charged. Publish runs while the row locks
// are held, so it must be bounded in time.
//
// When ctx ends during the batch (the instance drains) the rows not yet
// published are left, but the marks of those published and the commit
// still run, on a context of their own bounded by markTimeout: rolled back
// with the cancelled context, every row already published would be
// published again by the next relay.
//
// No step waits on PostgreSQL without a deadline, whatever ctx carries:
// the relay runs on a context only its Close ends, and a connection that
// goes silent (a request lost on its way, nothing reset) would otherwise
// hold the relay until the kernel gives the connection up, many minutes
// later. The claim (pool wait, BEGIN and the SELECT) gets twice the
// claim budget (relayClaimBudget) and the server cuts each of the
// transaction's statements and lock waits at one budget (SET LOCAL
// lock_timeout and statement_timeout, sent with BEGIN); each publish is
// bounded by the relay, and the marks and the commit, or the rollback, get
// markTimeout. A claim cut short drops its connection (the pool dials a
// new one) and fails the run; the rows stay undelivered for the next run.
func (s *Store) RelayOutbox(ctx context.Context, grace time.Duration, limit int,
	publish func(ctx context.Context, row pubsub.OutboxRow) error) (run pubsub.OutboxRun, err error) {
	budget := s.relayClaimBudget()
	cctx, ccancel := context.WithTimeout(ctx, 2*budget)
	defer ccancel()
	ms := budget.Milliseconds()
	tx, err := s.pool.BeginTx(cctx, pgx.TxOptions{
		BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms)})
	if err != nil {
		return run, fmt.Errorf("relay outbox: %w", err)
	}
	defer func() {
		rctx, cancel := pubsub.MarksContext(ctx, markTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}()
	rows, err := tx.Query(cctx, `SELECT o.id, o.event_id::text, o.channel, o.entity_id, o.payload, o.attempts, `+outboxMessageColumns+`
		FROM outbox o LEFT JOIN messages ON messages.id = o.message_id
		WHERE o.delivered_at IS NULL AND o.created_at < now() - make_interval(secs => $1)
			AND (o.message_id IS NULL OR messages.id IS NOT NULL) AND o.attempts < $3
		ORDER BY o.id LIMIT $2 FOR UPDATE OF o SKIP LOCKED`, grace.Seconds(), limit, pubsub.OutboxMaxAttempts)
	if err != nil {
		return run, fmt.Errorf("relay outbox: %w", err)
	}
	batch, err := pgx.CollectRows(rows, scanOutboxRow)
	if err != nil {
		return run, fmt.Errorf("relay outbox: %w", err)
	}
	ok, charged := publishClaimed(ctx, batch, publish)
	mctx, cancel := pubsub.MarksContext(ctx, markTimeout)
	defer cancel()
	if len(ok) > 0 {
		if _, err := tx.Exec(mctx, `UPDATE outbox SET delivered_at = now(), attempts = attempts + 1
			WHERE id = ANY($1)`, ok); err != nil {
			return run, fmt.Errorf("relay outbox: %w", err)
		}
	}
	if len(charged) > 0 {
		rows, err := tx.Query(mctx, `UPDATE outbox SET attempts = attempts + 1 WHERE id = ANY($1)
			RETURNING event_id::text, attempts >= $2`, charged, pubsub.OutboxMaxAttempts)
		if err == nil {
			run.GivenUp, err = collectGivenUp(rows)
		}
		if err != nil {
			return run, fmt.Errorf("relay outbox: %w", err)
		}
	}
	if err := tx.Commit(mctx); err != nil {
		return run, fmt.Errorf("relay outbox: %w", err)
	}
	run.Claimed, run.Delivered = len(batch), len(ok)
	return run, nil
}

// collectGivenUp reads the event ids of the charged rows that reached the
// attempt limit.
func collectGivenUp(rows pgx.Rows) ([]string, error) {
	var out []string
	var id string
	var over bool
	_, err := pgx.ForEachRow(rows, []any{&id, &over}, func() error {
		if over {
			out = append(out, id)
		}
		return nil
	})
	return out, err
}

// publishClaimed publishes the claimed rows in order (RelayOutbox) and
// returns the ids of those published and of those to charge an attempt.
func publishClaimed(ctx context.Context, batch []claimedRow,
	publish func(ctx context.Context, row pubsub.OutboxRow) error) (ok, charged []int64) {
	for _, c := range batch {
		if ctx.Err() != nil {
			break
		}
		if c.broken {
			charged = append(charged, c.row.ID)
			continue
		}
		err := publish(ctx, c.row)
		if err == nil {
			ok = append(ok, c.row.ID)
			continue
		}
		if errors.Is(err, pubsub.ErrRowRefusedAlone) {
			charged = append(charged, c.row.ID)
			continue
		}
		if !errors.Is(err, rds.ErrLockHeld) && !errors.Is(err, pubsub.ErrRowDeferred) {
			break
		}
	}
	return ok, charged
}

// markTimeout bounds the relay's marks and commit once its batch is
// published, whatever happened to the run's context, and its rollback;
// the relay's Shutdown may cut them sooner (pubsub.MarksContext).
const markTimeout = 2 * time.Second

// relayClaimBudget is the server-side bound (lock_timeout,
// statement_timeout) of the relay transaction's statements; the claim as
// a whole gets twice as long on the client. It is the request budget
// (HAN_DB_REQUEST_TIMEOUT), but at least minRelayClaimBudget: a request
// budget tuned tight for request latency must not starve the relay, which
// is what delivers the events the request path could not publish.
func (s *Store) relayClaimBudget() time.Duration { return max(s.reqTimeout, minRelayClaimBudget) }

// minRelayClaimBudget is the least relayClaimBudget.
const minRelayClaimBudget = time.Second

// outboxMessageColumns is the message of a message.created outbox row
// (message_id set), whose frame is built from it: messageColumns of the
// joined messages row, NULL when the row has no message.
const outboxMessageColumns = `messages.id IS NOT NULL, COALESCE(messages.id::text, ''), COALESCE(messages.dialog_id::text, ''),
	COALESCE(messages.seq, 0), COALESCE(messages.sender_id::text, ''), COALESCE(messages.body, ''),
	COALESCE(messages.client_message_id, ''), COALESCE(messages.created_at, now()), ` + attachmentsColumn

// claimedRow is an outbox row the relay claimed; broken when its frame
// could not be built (it is charged an attempt, not published).
type claimedRow struct {
	row    pubsub.OutboxRow
	broken bool
}

// scanOutboxRow reads a claimed outbox row. A message.created row's frame is
// built from its message under the row's event id, the same bytes the
// request path published (pubsub.MessageCreated depends on nothing else);
// other rows carry their frame in payload. A frame that cannot be built
// marks the row broken instead of failing the batch.
func scanOutboxRow(r pgx.CollectableRow) (claimedRow, error) {
	var c claimedRow
	o := &c.row
	var m Message
	var hasMessage bool
	var atts string
	if err := r.Scan(&o.ID, &o.EventID, &o.Channel, &o.EntityID, &o.Payload, &o.Attempts, &hasMessage,
		&m.ID, &m.DialogID, &m.Seq, &m.SenderID, &m.Body, &m.ClientMessageID, &m.CreatedAt, &atts); err != nil {
		return c, err
	}
	if !hasMessage {
		return c, nil
	}
	var err error
	if m.Attachments, err = decodeAttachmentRefs(atts); err == nil {
		var ev OutboxEvent
		ev, err = messageCreatedEvent(o.EventID, m)
		o.Payload = ev.Payload
	}
	c.broken = err != nil
	return c, nil
}

// OutboxPending counts undelivered outbox rows (metrics and tests).
func (s *Store) OutboxPending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE delivered_at IS NULL").Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox pending: %w", err)
	}
	return n, nil
}

// messageCreatedEvent is the outbox event of a committed message: the
// message.created frame as pubsub builds it under eventID, on the dialog's
// channel.
func messageCreatedEvent(eventID string, m Message) (OutboxEvent, error) {
	frame, err := pubsub.MessageCreated(eventID, m.Wire())
	if err != nil {
		return OutboxEvent{}, err
	}
	return OutboxEvent{EventID: eventID, Channel: pubsub.DialogChannel(m.DialogID), EntityID: m.ID, Payload: frame}, nil
}
