package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
)

// SendMessage is the input of Store.SendMessage.
type SendMessage struct {
	ID              string
	DialogID        string
	SenderID        string
	Body            string
	ClientMessageID string
	// AttachmentIDs are uploaded, unlinked attachments of this dialog by this
	// sender, linked in this order (ErrInvalidAttachment otherwise).
	AttachmentIDs []string
	// Event writes the message.created event to the outbox in the same
	// transaction; SendMessage returns it (its frame built by
	// pubsub.MessageCreated) for the publish after the commit.
	Event bool
	// SafetyTask records the message's pending legacy safety task in the
	// same transaction.
	SafetyTask bool
	// Idem, when set, is the request's idempotency record, written in the
	// same transaction. Its resource is always the message and its version
	// the message's seq (PostgreSQL fills both, since the seq is assigned
	// there); Record gives the rest (status, meta).
	Idem *IdemWrite[Message]
}

// ErrDialogBusy means this instance already holds as many sends into the
// dialog as its queue allows (SetSendQueue, HAN_SEND_DIALOG_QUEUE): the
// send was refused before anything was written. The API answers 503
// dialog_busy with Retry-After.
var ErrDialogBusy = errors.New("store: dialog busy")

// SendMessage inserts a message with the next seq of its dialog, with its
// outbox event, safety task, attachment links and idempotency record, all in
// one transaction that is one statement (the send_messages function): one
// client round trip, and the dialog's row lock, which makes seqs gapless and
// unique, is held only while PostgreSQL runs it and commits.
//
// Concurrent sends into one dialog on this instance are combined (see
// sendCombiner): one transaction writes them all, seqs in the order they
// reached the combiner, and each caller gets its own message. A send that
// fails its own checks (not a member: ErrDialogNotFound; a bad attachment:
// ErrInvalidAttachment; a live idempotency record: ErrIdemExists) fails
// alone. A repeat of the same sender's clientMessageId returns the stored
// message with created=false and writes nothing. A full dialog queue is
// ErrDialogBusy; a caller whose context ends while its send still waits is
// dropped from the queue (nothing written); once its send is being written
// it waits for the outcome, which its idempotency record and
// clientMessageId cover anyway.
func (s *Store) SendMessage(ctx context.Context, in SendMessage) (m Message, ev OutboxEvent, created bool, err error) {
	r := &sendReq{in: in, deadline: time.Now().Add(s.reqTimeout), done: make(chan struct{})}
	if d, ok := ctx.Deadline(); ok && d.Before(r.deadline) {
		r.deadline = d
	}
	if in.Event {
		r.eventID = ids.New()
	}
	if in.Idem != nil {
		r.idem = in.Idem.Record(Message{ID: in.ID, DialogID: in.DialogID, SenderID: in.SenderID, Body: in.Body,
			ClientMessageID: in.ClientMessageID})
		if r.idem.Meta == "" {
			r.idem.Meta = "{}"
		}
	}
	if err := s.sends.send(ctx, r); err != nil {
		return Message{}, OutboxEvent{}, false, err
	}
	return r.res.m, r.res.ev, r.res.created, r.res.err
}

// sendReq is one send waiting in, or written by, the combiner.
type sendReq struct {
	in      SendMessage
	eventID string // "" without an event
	// deadline ends the send's request budget, counted from its arrival
	// (or the caller's earlier deadline): the time it waits in the queue is
	// part of it.
	deadline time.Time
	idem     IdemRecord // Status and Meta of in.Idem's record
	taken    bool       // in a batch being written (guarded by the combiner's mutex)
	res      sendResult
	done     chan struct{} // closed once res is set
}

type sendResult struct {
	m       Message
	ev      OutboxEvent
	created bool
	err     error
}

func (r *sendReq) finish(res sendResult) {
	r.res = res
	close(r.done)
}

// errQueuedPastBudget answers a send whose budget ran out while it
// waited for its turn to be written.
func errQueuedPastBudget() error {
	return fmt.Errorf("%w: send queued past its budget", ErrDatabaseBusy)
}

const sendMessagesSQL = `SELECT r_ord, r_outcome, r_ref, r_id, r_seq, r_sender, r_body, r_cmid, r_created_at, r_attachments
	FROM send_messages($1::uuid, $2::text, $3::bigint, $4::text[]::uuid[], $5::text[]::uuid[], $6::text[], $7::text[], $8::int[], $9::text[]::uuid[],
		$10::text[], $11::boolean[], $12::text[], $13::text[], $14::text[], $15::int[], $16::text[], $17::bigint[])`

// sendArgs lays the batch out as the parallel arrays send_messages takes.
func sendArgs(dialogID string, lockTimeout time.Duration, batch []*sendReq) []any {
	n := len(batch)
	var (
		msgIDs, senders, bodies, cmids, attIDs, events = make([]string, n), make([]string, n), make([]string, n), make([]string, n), []string{}, make([]string, n)
		scopes, keys, fps, metas                       = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		attCounts, statuses                            = make([]int32, n), make([]int32, n)
		safety                                         = make([]bool, n)
		ttls                                           = make([]int64, n)
	)
	for i, r := range batch {
		in := r.in
		msgIDs[i], senders[i], bodies[i], cmids[i], events[i] = in.ID, in.SenderID, in.Body, in.ClientMessageID, r.eventID
		attCounts[i] = int32(len(in.AttachmentIDs))
		attIDs = append(attIDs, in.AttachmentIDs...)
		safety[i] = in.SafetyTask
		if w := in.Idem; w != nil {
			scopes[i], keys[i], fps[i], statuses[i], metas[i], ttls[i] = w.Key.Scope, w.Key.KeyHMAC, w.Fingerprint, int32(r.idem.Status), r.idem.Meta, w.TTL.Milliseconds()
		} else {
			metas[i] = "{}"
		}
	}
	return []any{dialogID, pubsub.DialogChannel(dialogID), lockTimeout.Milliseconds(), msgIDs, senders, bodies, cmids, attCounts, attIDs,
		events, safety, scopes, keys, fps, statuses, metas, ttls}
}

// sendRow is one row send_messages returns.
type sendRow struct {
	ord, ref                       int32
	outcome, id, sender, body, cid string
	seq                            int64
	createdAt                      time.Time
	atts                           string
}

// writeBatch writes a batch of sends into one dialog in one statement (in a
// group transaction with other dialogs' batches when the instance's send
// transactions are all busy: commitGroups) and answers each of them. A send
// whose budget ran out while it waited is answered ErrDatabaseBusy
// unwritten; the statement gets what is left of the earliest budget of the
// others. When the statement fails as a whole for a reason that may lie in
// one message's data (a value PostgreSQL refuses), nothing was committed
// and each send is written again on its own, so that message fails alone; a
// busy or unreachable database fails the whole batch.
func (s *Store) writeBatch(dialogID string, batch []*sendReq, refill func() []*sendReq) {
	now := time.Now()
	b := &dialogBatch{dialogID: dialogID, reqs: make([]*sendReq, 0, len(batch)), refill: refill}
	for _, r := range batch {
		if !now.Before(r.deadline) {
			r.finish(sendResult{err: errQueuedPastBudget()})
			continue
		}
		if b.deadline.IsZero() || r.deadline.Before(b.deadline) {
			b.deadline = r.deadline
		}
		b.reqs = append(b.reqs, r)
	}
	if len(b.reqs) == 0 {
		return
	}
	s.groups.commit(b)
	if b.err != nil {
		var pe *pgconn.PgError
		if len(b.reqs) > 1 && errors.As(b.err, &pe) && !IsDatabaseBusy(b.err) {
			for _, r := range b.reqs {
				s.writeBatch(dialogID, []*sendReq{r}, nil)
			}
			return
		}
		for _, r := range b.reqs {
			r.finish(sendResult{err: b.err})
		}
		return
	}
	answerBatch(b.reqs, b.rows)
}

// execSendBatch runs send_messages within budget: the pool wait is bounded
// by it, each lock wait by lockWait (lock_timeout, set by the function for
// its own transaction only; at most the budget); the client gives the call
// one request budget more before it gives up on the connection.
func (s *Store) execSendBatch(dialogID string, budget, lockWait time.Duration, batch []*sendReq) ([]sendRow, error) {
	ctx, conn, done, err := s.sendConn(budget)
	if err != nil {
		return nil, err
	}
	defer done()
	lockWait = min(max(lockWait, time.Millisecond), max(budget, time.Millisecond))
	rows, err := conn.Query(ctx, sendMessagesSQL, sendArgs(dialogID, lockWait, batch)...)
	var out []sendRow
	if err == nil {
		out, err = scanSendRows(rows, len(batch))
	}
	if err != nil {
		return nil, sendError(err)
	}
	return out, nil
}

// sendConn is a pool connection for a send statement within budget (at
// least 1 ms) and the statement's context: the pool wait is bounded by the
// budget, and the client gives the statement one request budget more
// before it gives up on the connection. done releases both.
func (s *Store) sendConn(budget time.Duration) (context.Context, *pgxpool.Conn, func(), error) {
	budget = max(budget, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), budget+s.reqTimeout)
	conn, err := s.acquireWithin(ctx, budget)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, conn, func() { conn.Release(); cancel() }, nil
}

// scanSendRows reads the rows of one send_messages call of n messages and
// closes them.
func scanSendRows(rows pgx.Rows, n int) ([]sendRow, error) {
	out := make([]sendRow, 0, n)
	for rows.Next() {
		var r sendRow
		if err := rows.Scan(&r.ord, &r.outcome, &r.ref, &r.id, &r.seq, &r.sender, &r.body, &r.cid, &r.createdAt, &r.atts); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("%d answers for %d messages", len(out), n)
	}
	return out, nil
}

// sendError is the error a failed send statement returns: ErrDatabaseBusy
// for a lock or statement over budget, the PostgreSQL error (wrapped) for
// anything else.
func sendError(err error) error {
	if IsDatabaseBusy(err) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: send message: %w", ErrDatabaseBusy, err)
	}
	return fmt.Errorf("send message: %w", err)
}

// answerBatch gives each send of the batch its outcome from the rows
// send_messages returned (one per message, any order).
func answerBatch(batch []*sendReq, rows []sendRow) {
	byOrd := make([]*sendRow, len(batch))
	for i := range rows {
		if o := int(rows[i].ord); o >= 1 && o <= len(batch) {
			byOrd[o-1] = &rows[i]
		}
	}
	// Created messages first: a duplicate within the batch answers the
	// message an earlier send of the batch created.
	results := make([]sendResult, len(batch))
	for i, r := range batch {
		if row := byOrd[i]; row != nil && row.outcome == "created" {
			results[i] = createdResult(r, row)
		}
	}
	for i, r := range batch {
		row := byOrd[i]
		switch {
		case row == nil:
			results[i].err = errors.New("send message: no answer for the message")
		case row.outcome == "created":
		case row.outcome == "duplicate" && row.ref > 0 && int(row.ref) <= len(batch):
			results[i] = sendResult{m: results[row.ref-1].m, err: results[row.ref-1].err}
		case row.outcome == "duplicate":
			m := Message{ID: row.id, DialogID: r.in.DialogID, Seq: row.seq, SenderID: row.sender, Body: row.body,
				ClientMessageID: row.cid, CreatedAt: row.createdAt}
			atts, err := decodeAttachmentRefs(row.atts)
			m.Attachments = atts
			results[i] = sendResult{m: m, err: err}
		case row.outcome == "not_member":
			results[i].err = ErrDialogNotFound
		case row.outcome == "invalid_attachment":
			results[i].err = ErrInvalidAttachment
		case row.outcome == "idem_exists":
			results[i].err = ErrIdemExists
		default:
			results[i].err = fmt.Errorf("send message: unknown outcome %q", row.outcome)
		}
	}
	for i, r := range batch {
		r.finish(results[i])
	}
}

func createdResult(r *sendReq, row *sendRow) sendResult {
	in := r.in
	m := Message{ID: in.ID, DialogID: in.DialogID, Seq: row.seq, SenderID: in.SenderID, Body: in.Body,
		ClientMessageID: in.ClientMessageID, CreatedAt: row.createdAt}
	atts, err := decodeAttachmentRefs(row.atts)
	if err != nil {
		return sendResult{err: err}
	}
	m.Attachments = atts
	res := sendResult{m: m, created: true}
	if r.eventID != "" {
		// The message is committed: a frame that cannot be built here (it
		// always can) is left to the outbox relay, never reported as a
		// failed send.
		res.ev, _ = messageCreatedEvent(r.eventID, m)
	}
	return res
}
