package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
// dialog as its queue allows (SetSendQueue, HAN_SEND_DIALOG_QUEUE), or as
// many of the sender's own as one sender may hold in it (sendShare): the
// send was refused before anything was written. Only a member of the
// dialog is told so; a sender who is no member gets ErrDialogNotFound. The
// sends of senders who are no members hold at most an eighth of the queue
// together (unverifiedShare), so they never leave a member dialog_busy. The
// API answers 503 dialog_busy with Retry-After.
var ErrDialogBusy = errors.New("store: dialog busy")

// SendMessage inserts a message with the next seq of its dialog, with its
// outbox event, safety task, attachment links and idempotency record, all in
// one transaction that is one statement (the send_groups function): one
// client round trip, and the dialog's row lock, which makes seqs gapless and
// unique, is held only while PostgreSQL runs it and commits.
//
// Concurrent sends into one dialog on this instance are combined (see
// sendCombiner): one transaction writes them all (up to maxGroupSends; the
// rest, in order, the next), seqs in the order they reached the combiner,
// and each caller gets its own message. A send that
// fails its own checks (not a member: ErrDialogNotFound; a bad attachment:
// ErrInvalidAttachment; a live idempotency record: ErrIdemExists) fails
// alone. A repeat of the same sender's clientMessageId returns the stored
// message with created=false and writes nothing. A full dialog queue, or a
// sender's full share of it, is ErrDialogBusy for a member,
// ErrDialogNotFound for anyone else; a send of a sender not known to be a
// member that finds such senders' part of the queue full is queued once a
// membership read found the sender a member, and is ErrDialogNotFound
// otherwise (sendCombiner); a caller
// whose context ends while its send still waits is dropped from the queue
// (nothing written); once its send is being written it waits for the
// outcome, which its idempotency record and clientMessageId cover anyway.
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
	err = s.sends.send(ctx, r)
	switch {
	case errors.Is(err, errUnverified):
		err = s.sendAsMember(ctx, r)
	case errors.Is(err, ErrDialogBusy):
		err = s.busyForMember(ctx, in)
	}
	if err != nil {
		return Message{}, OutboxEvent{}, false, err
	}
	return r.res.m, r.res.ev, r.res.created, r.res.err
}

// busyForMember is the answer to a send its dialog's queue refused (full,
// or the sender's share of it full): ErrDialogBusy for a member of the
// dialog, ErrDialogNotFound for anyone else, as for every other send of
// theirs and for a dialog that does not exist, so a dialog's load tells an
// outsider nothing. The membership read runs only on this path, never on a
// send the queue takes.
func (s *Store) busyForMember(ctx context.Context, in SendMessage) error {
	member, err := s.IsMember(ctx, in.DialogID, in.SenderID)
	switch {
	case err != nil:
		return err
	case !member:
		return ErrDialogNotFound
	}
	return ErrDialogBusy
}

// sendAsMember is the answer to a send the combiner refused because its
// sender is not known to be a member of the dialog and such senders' sends
// already hold their part of its queue (errUnverified): the membership is
// read, and a member's send is queued as a member's (ErrDialogBusy only
// when the queue, or the sender's share of it, is full), anyone else's is
// answered ErrDialogNotFound, as every other send of theirs. The read runs
// only on this path (a sender the combiner knows, or one that finds room,
// costs none), and is the realtime subscribe's batched check
// (checkLastSeq): the members of a dialog the instance has not seen send
// yet, arriving at once, share one statement and one pool connection.
func (s *Store) sendAsMember(ctx context.Context, r *sendReq) error {
	_, member, err := s.checkLastSeq(ctx, r.in.DialogID, r.in.SenderID)
	if err != nil {
		return err
	}
	s.sends.learnMember(r.in.DialogID, r.in.SenderID, member)
	if !member {
		return ErrDialogNotFound
	}
	r.member = true
	return s.sends.send(ctx, r)
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
	// member: a membership read found the sender a member (sendAsMember).
	member bool
	// unverified: queued while its sender was not known to be a member,
	// in its queue's unverified part (guarded by the combiner's mutex).
	unverified bool
	res        sendResult
	done       chan struct{} // closed once res is set
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

const sendGroupsSQL = `SELECT r_ord, r_outcome, r_ref, r_id, r_seq, r_sender, r_body, r_cmid, r_created_at, r_attachments
	FROM send_groups($1::text[]::uuid[], $2::text[], $3::bigint, $4::int[], $5::text[]::uuid[], $6::text[]::uuid[], $7::text[], $8::text[],
		$9::int[], $10::text[]::uuid[], $11::text[], $12::boolean[], $13::text[], $14::text[], $15::text[], $16::int[], $17::text[], $18::bigint[])`

// sendArgs lays the batches out as the parallel arrays send_groups takes:
// the dialogs and their channels, then every batch's messages in turn, each
// with the index of its dialog.
func sendArgs(lockTimeout time.Duration, group []*dialogBatch) []any {
	n := 0
	for _, b := range group {
		n += len(b.reqs)
	}
	var (
		dialogs, channels                              = make([]string, len(group)), make([]string, len(group))
		msgDialogs                                     = make([]int32, 0, n)
		msgIDs, senders, bodies, cmids, attIDs, events = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), []string{}, make([]string, 0, n)
		scopes, keys, fps, metas                       = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		attCounts, statuses                            = make([]int32, 0, n), make([]int32, 0, n)
		safety                                         = make([]bool, 0, n)
		ttls                                           = make([]int64, 0, n)
	)
	for g, b := range group {
		dialogs[g], channels[g] = b.dialogID, pubsub.DialogChannel(b.dialogID)
		for _, r := range b.reqs {
			in := r.in
			msgDialogs = append(msgDialogs, int32(g+1))
			msgIDs, senders, bodies, cmids, events = append(msgIDs, in.ID), append(senders, in.SenderID), append(bodies, in.Body),
				append(cmids, in.ClientMessageID), append(events, r.eventID)
			attCounts = append(attCounts, int32(len(in.AttachmentIDs)))
			attIDs = append(attIDs, in.AttachmentIDs...)
			safety = append(safety, in.SafetyTask)
			if w := in.Idem; w != nil {
				scopes, keys, fps = append(scopes, w.Key.Scope), append(keys, w.Key.KeyHMAC), append(fps, w.Fingerprint)
				statuses, metas, ttls = append(statuses, int32(r.idem.Status)), append(metas, r.idem.Meta), append(ttls, w.TTL.Milliseconds())
			} else {
				scopes, keys, fps = append(scopes, ""), append(keys, ""), append(fps, "")
				statuses, metas, ttls = append(statuses, 0), append(metas, "{}"), append(ttls, 0)
			}
		}
	}
	return []any{dialogs, channels, lockTimeout.Milliseconds(), msgDialogs, msgIDs, senders, bodies, cmids, attCounts, attIDs,
		events, safety, scopes, keys, fps, statuses, metas, ttls}
}

// sendRow is one row send_groups returns (ord and ref as indexes into its
// batch once split: scanSendRows).
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
// others (its lock waits and its run, bounded on the server:
// runSendGroup). When the statement fails as a whole for a reason that may
// lie in one message's data (a value PostgreSQL refuses), nothing was
// committed and each send is written again on its own, so that message
// fails alone. A busy database answers database_busy only the sends whose
// budget ran out (writeAlone); an unreachable one fails the whole batch.
func (s *Store) writeBatch(dialogID string, batch []*sendReq, queue *queueRef) {
	now := time.Now()
	b := &dialogBatch{dialogID: dialogID, reqs: make([]*sendReq, 0, len(batch)), queue: queue}
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
	s.sends.learn(dialogID, b.reqs, b.rows)
	answerBatch(b.reqs, b.rows)
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

// scanSendRows reads the rows of one send_groups call for group (one per
// message), closes them, and splits them by batch, each row's ord and ref
// turned into indexes into its own batch.
func scanSendRows(rows pgx.Rows, group []*dialogBatch) ([][]sendRow, error) {
	// first[g] is the call's index (1-based) of batch g's first message.
	first := make([]int32, len(group)+1)
	first[0] = 1
	for g, b := range group {
		first[g+1] = first[g] + int32(len(b.reqs))
	}
	out := make([][]sendRow, len(group))
	for g, b := range group {
		out[g] = make([]sendRow, 0, len(b.reqs))
	}
	n := 0
	for rows.Next() {
		var r sendRow
		if err := rows.Scan(&r.ord, &r.outcome, &r.ref, &r.id, &r.seq, &r.sender, &r.body, &r.cid, &r.createdAt, &r.atts); err != nil {
			rows.Close()
			return nil, err
		}
		// The batch g with first[g] <= ord < first[g+1].
		g := sort.Search(len(group), func(g int) bool { return first[g+1] > r.ord })
		if g >= len(group) || r.ord < first[g] {
			rows.Close()
			return nil, fmt.Errorf("send message: answer for message %d of %d", r.ord, first[len(group)]-1)
		}
		r.ord -= first[g] - 1
		if r.ref > 0 {
			r.ref -= first[g] - 1
		}
		out[g] = append(out[g], r)
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if want := int(first[len(group)] - 1); n != want {
		return nil, fmt.Errorf("%d answers for %d messages", n, want)
	}
	return out, nil
}

// sendError is the error a failed send statement returns: ErrDatabaseBusy
// for a lock or statement the server cut short over budget (nothing
// committed), the error (wrapped) for anything else. A statement whose
// answer did not come within the client's deadline is not busy: it was
// sent and may have committed (IsPGUnavailable, its outcome unknown; a
// retry with the same idempotency key or clientMessageId answers it).
func sendError(err error) error {
	if IsDatabaseBusy(err) {
		return fmt.Errorf("%w: send message: %w", ErrDatabaseBusy, err)
	}
	return fmt.Errorf("send message: %w", err)
}

// answerBatch gives each send of the batch its outcome from the rows
// send_groups returned for it (one per message, any order).
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
