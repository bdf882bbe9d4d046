package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
)

// Domain errors the API maps to stable codes.
var (
	ErrDialogNotFound = errors.New("store: dialog not found")
	ErrUserNotFound   = errors.New("store: user not found")
	ErrInvalidCursor  = errors.New("store: invalid cursor")
)

// Store is the PostgreSQL data access of the chat core. It is safe for
// concurrent use (the pool is).
type Store struct {
	pool *pgxpool.Pool
	// reqTimeout is the budget of a request transaction (requestTx).
	reqTimeout time.Duration
	// sends combines concurrent sends into one dialog (SendMessage).
	sends *sendCombiner
	// groups writes the combined batches of different dialogs, in one
	// transaction when they are ready together (SendMessage).
	groups *commitGroups
	// lastSeqs combines concurrent DialogLastSeq checks (realtime_batch.go).
	lastSeqs *stmtBatcher[*lastSeqCall]
	// userDialogs combines concurrent DialogIDsForUser reads (userdialogs_batch.go).
	userDialogs *stmtBatcher[*userDialogsCall]
	// ensureUsers combines concurrent EnsureUser records (users_batch.go).
	ensureUsers *stmtBatcher[*ensureUserCall]
	// lastSeen combines concurrent TouchLastSeen records (lastseen_batch.go).
	lastSeen *stmtBatcher[*lastSeenCall]
	// known is the users EnsureUser already recorded (a bounded set: users
	// are never deleted, so a known id needs no further write).
	known knownUsers
}

// New wraps a pool; request transactions get DefaultRequestTimeout, and a
// dialog's send queue holds DefaultSendQueue sends.
func New(pool *pgxpool.Pool) *Store {
	s := &Store{pool: pool, reqTimeout: DefaultRequestTimeout}
	s.sends = newSendCombiner(s.writeBatch)
	s.groups = newCommitGroups(s.execGroup)
	s.lastSeqs = newLastSeqBatcher(s)
	s.userDialogs = newUserDialogsBatcher(s)
	s.ensureUsers = newEnsureUsersBatcher(s)
	s.lastSeen = newLastSeenBatcher(s)
	return s
}

// Pool exposes the pool for health checks and other stores.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that PostgreSQL answers over the request pool.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// PoolLoad is the request pool's load at one moment.
type PoolLoad struct {
	Max, Total, Acquired, Idle int32
}

// PoolLoad reports the request pool's load.
func (s *Store) PoolLoad() PoolLoad {
	st := s.pool.Stat()
	return PoolLoad{Max: st.MaxConns(), Total: st.TotalConns(), Acquired: st.AcquiredConns(), Idle: st.IdleConns()}
}

// Dialog is a conversation between members.
type Dialog struct {
	ID        string
	Title     string
	MemberIDs []string // the creator first, then the others by id
	LastSeq   int64
	CreatedAt time.Time
	// LastMessage is the newest message, filled by ListDialogs only (nil
	// when the dialog has none).
	LastMessage *Message
}

// Message is one chat message; Seq is gapless per dialog.
type Message struct {
	ID              string
	DialogID        string
	Seq             int64
	SenderID        string
	Body            string
	ClientMessageID string
	CreatedAt       time.Time
	Attachments     []AttachmentRef // in the sender's order; nil when none
}

// Wire is the message as clients see it: the data of its message.created
// event and, in the REST API's message DTO, the answer of a send and of the
// history. It is the one conversion, so the three carry the same fields: a
// field clients should see is added here once (and to pubsub.Message).
func (m Message) Wire() pubsub.Message {
	atts := make([]pubsub.Attachment, len(m.Attachments))
	for i, a := range m.Attachments {
		atts[i] = pubsub.Attachment{ID: a.ID, Filename: a.Filename, ContentType: a.ContentType, SizeBytes: a.SizeBytes}
	}
	return pubsub.Message{ID: m.ID, DialogID: m.DialogID, Seq: m.Seq, SenderID: m.SenderID, Body: m.Body,
		CreatedAt: m.CreatedAt.UnixMilli(), Attachments: atts}
}

// OutboxEvent is a realtime event stored in the outbox in the same
// transaction as its business effect.
type OutboxEvent struct {
	EventID  string
	Channel  string
	EntityID string
	Payload  []byte
}

// EnsureUser records a user on first sight (idempotent).
func (s *Store) EnsureUser(ctx context.Context, id string) error {
	if s.known.has(id) {
		return nil
	}
	if err := s.recordUser(ctx, id); err != nil {
		return fmt.Errorf("ensure user: %w", err)
	}
	s.known.add(id)
	return nil
}

// knownUsersMax bounds the set of known users; past it the set starts
// over (an id it forgot costs one idempotent INSERT again).
const knownUsersMax = 100_000

// knownUsers is a bounded set of user ids recorded in PostgreSQL. It spares
// every authenticated request and handshake of a known user a write. Safe
// for concurrent use.
type knownUsers struct {
	m sync.Map
	n atomic.Int64
}

func (k *knownUsers) has(id string) bool {
	_, ok := k.m.Load(id)
	return ok
}

func (k *knownUsers) add(id string) {
	if k.n.Add(1) > knownUsersMax {
		k.m.Clear()
		k.n.Store(0)
	}
	k.m.Store(id, struct{}{})
}

// UserExists reports whether a user has been seen.
func (s *Store) UserExists(ctx context.Context, id string) (bool, error) {
	var ok bool
	err := s.reqQueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM users WHERE id=$1)", id).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("user exists: %w", err)
	}
	return ok, nil
}

// CreateDialog creates a dialog whose members are the creator plus
// memberIDs (deduplicated). Every member must be a known user
// (ErrUserNotFound otherwise). The idempotency records in idem are written
// in the same transaction.
func (s *Store) CreateDialog(ctx context.Context, id, creator, title string, memberIDs []string, idem ...*IdemWrite[Dialog]) (Dialog, error) {
	members := []string{creator}
	seen := map[string]bool{creator: true}
	for _, m := range memberIDs {
		if !seen[m] {
			seen[m] = true
			members = append(members, m)
		}
	}
	var d Dialog
	err := s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var known int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM users WHERE id = ANY($1::text[]::uuid[])", members).Scan(&known); err != nil {
			return err
		}
		if known != len(members) {
			return ErrUserNotFound
		}
		if err := tx.QueryRow(ctx,
			"INSERT INTO dialogs(id, title, created_by) VALUES ($1,$2,$3) RETURNING created_at",
			id, title, creator).Scan(&d.CreatedAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			"INSERT INTO dialog_members(dialog_id, user_id, dialog_created_at) SELECT $1, unnest($2::text[]::uuid[]), $3",
			id, members, d.CreatedAt); err != nil {
			return err
		}
		d.ID, d.Title, d.MemberIDs = id, title, members
		for _, w := range idem {
			if err := w.insert(ctx, tx, d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrUserNotFound) || errors.Is(err, ErrIdemExists) {
			return Dialog{}, err
		}
		return Dialog{}, fmt.Errorf("create dialog: %w", err)
	}
	d.ID, d.Title, d.MemberIDs = id, title, members
	return d, nil
}

// dialogColumns reads a dialog d; its members come in the order its
// creation answers them (the creator first, then the others by id), so the
// dialog reads the same in every answer.
const dialogColumns = `d.id::text, d.title, d.last_seq, d.created_at,
	ARRAY(SELECT m.user_id::text FROM dialog_members m WHERE m.dialog_id = d.id
		ORDER BY m.user_id <> d.created_by, m.user_id)`

func scanDialog(row pgx.Row) (Dialog, error) {
	var d Dialog
	err := row.Scan(&d.ID, &d.Title, &d.LastSeq, &d.CreatedAt, &d.MemberIDs)
	return d, err
}

// DialogForMember returns the dialog if userID is a member; a dialog the
// user is not in is reported as ErrDialogNotFound (no existence leak).
func (s *Store) DialogForMember(ctx context.Context, dialogID, userID string) (Dialog, error) {
	d, err := scanDialog(s.reqQueryRow(ctx, `SELECT `+dialogColumns+` FROM dialogs d
		JOIN dialog_members me ON me.dialog_id = d.id AND me.user_id = $2 WHERE d.id = $1`, dialogID, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Dialog{}, ErrDialogNotFound
	}
	if err != nil {
		return Dialog{}, fmt.Errorf("load dialog: %w", err)
	}
	return d, nil
}

// IsMember reports whether userID belongs to dialogID.
func (s *Store) IsMember(ctx context.Context, dialogID, userID string) (bool, error) {
	var ok bool
	err := s.reqQueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM dialog_members WHERE dialog_id=$1 AND user_id=$2)", dialogID, userID).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("membership: %w", err)
	}
	return ok, nil
}

// ListDialogs returns the user's dialogs, newest first, with keyset paging,
// each with its newest message (LastMessage, nil when it has none), all in
// one statement (listDialogsSQL). cursor is opaque ("" for the first page);
// next is "" on the last page.
func (s *Store) ListDialogs(ctx context.Context, userID, cursor string, limit int) (items []Dialog, next string, err error) {
	args := []any{userID, limit + 1}
	if cursor != "" {
		ts, id, err := decodeDialogCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		args = append(args, ts, id)
	}
	rows, err := s.reqQuery(ctx, listDialogsSQL(cursor != ""), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list dialogs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		d, err := scanListedDialog(rows)
		if err != nil {
			return nil, "", fmt.Errorf("scan dialog: %w", err)
		}
		items = append(items, d)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list dialogs: %w", err)
	}
	if len(items) > limit {
		items = items[:limit]
		last := items[len(items)-1]
		next = encodeDialogCursor(last.CreatedAt, last.ID)
	}
	return items, next, nil
}

// listDialogsSQL is the listing's statement: $1 the user, $2 the page size,
// and with a cursor ($3, $4) the (created_at, id) the page starts after.
// The page is chosen first, from the user's memberships in the
// (user_id, dialog_created_at DESC, dialog_id DESC) index: each membership
// carries its dialog's created_at, so the page is the index's next $2
// entries, read in order, however many dialogs the user is in. Then each
// of its dialogs reads its newest message with one backward probe of the
// unique (dialog_id, seq) index (LIMIT 1, no sort), so the cost grows with
// the page, not with the dialogs' messages. The same snapshot gives lastSeq
// and the message.
func listDialogsSQL(withCursor bool) string {
	where := ""
	if withCursor {
		where = " AND (me.dialog_created_at, me.dialog_id) < ($3, $4)"
	}
	return `SELECT ` + dialogColumns + `, lm.*
		FROM (SELECT d.id, d.title, d.last_seq, d.created_at, d.created_by FROM dialog_members me
			JOIN dialogs d ON d.id = me.dialog_id
			WHERE me.user_id = $1` + where + `
			ORDER BY me.dialog_created_at DESC, me.dialog_id DESC LIMIT $2) d
		LEFT JOIN LATERAL (SELECT ` + messageColumns + ` FROM messages
			WHERE messages.dialog_id = d.id ORDER BY messages.seq DESC LIMIT 1) lm ON true
		ORDER BY d.created_at DESC, d.id DESC`
}

// scanListedDialog reads a row of listDialogsSQL: the dialog's columns,
// then its newest message's (all NULL when it has none).
func scanListedDialog(row pgx.Row) (Dialog, error) {
	var (
		d                                Dialog
		id, dialogID, sender, body, cmid *string
		seq                              *int64
		created                          *time.Time
		atts                             *string
	)
	if err := row.Scan(&d.ID, &d.Title, &d.LastSeq, &d.CreatedAt, &d.MemberIDs,
		&id, &dialogID, &seq, &sender, &body, &cmid, &created, &atts); err != nil {
		return d, err
	}
	if id == nil {
		return d, nil
	}
	m := &Message{ID: *id, DialogID: *dialogID, Seq: *seq, SenderID: *sender, Body: *body, ClientMessageID: *cmid, CreatedAt: *created}
	var err error
	if m.Attachments, err = decodeAttachmentRefs(*atts); err != nil {
		return d, err
	}
	d.LastMessage = m
	return d, nil
}

func encodeDialogCursor(t time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.UnixMicro(), 10) + ":" + id))
}

// A dialog cursor carries a creation time, and dialogs are created at the
// server's clock time: a time outside years 1 to 9999 is no cursor the
// service handed out.
var (
	minCursorMicros = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	maxCursorMicros = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() - 1
)

// decodeDialogCursor reads a cursor of encodeDialogCursor. The client may
// send anything, so both parts are checked here, before they become query
// parameters: anything but a time in range and a UUID is ErrInvalidCursor,
// never a database error.
func decodeDialogCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrInvalidCursor
	}
	ts, id, ok := strings.Cut(string(raw), ":")
	us, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || us < minCursorMicros || us > maxCursorMicros {
		return time.Time{}, "", ErrInvalidCursor
	}
	if id, ok = ids.Canonical(id); !ok {
		return time.Time{}, "", ErrInvalidCursor
	}
	return time.UnixMicro(us), id, nil
}

const messageColumns = `id::text, dialog_id::text, seq, sender_id::text, body, COALESCE(client_message_id, ''), created_at, ` + attachmentsColumn

func scanMessage(row pgx.Row) (Message, error) {
	var m Message
	var atts string
	if err := row.Scan(&m.ID, &m.DialogID, &m.Seq, &m.SenderID, &m.Body, &m.ClientMessageID, &m.CreatedAt, &atts); err != nil {
		return m, err
	}
	var err error
	m.Attachments, err = decodeAttachmentRefs(atts)
	return m, err
}

// GetMessage loads one message by id.
func (s *Store) GetMessage(ctx context.Context, id string) (Message, error) {
	m, err := scanMessage(s.reqQueryRow(ctx, `SELECT `+messageColumns+` FROM messages WHERE id=$1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Message{}, ErrNotFound
	}
	if err != nil {
		return Message{}, fmt.Errorf("load message: %w", err)
	}
	return m, nil
}

// ErrNotFound is a generic missing row.
var ErrNotFound = errors.New("store: not found")

// ListMessages returns up to limit messages with seq > afterSeq in ascending
// seq order, and whether more exist (reconciliation after reconnect).
func (s *Store) ListMessages(ctx context.Context, dialogID string, afterSeq int64, limit int) ([]Message, bool, error) {
	rows, err := s.reqQuery(ctx, `SELECT `+messageColumns+` FROM messages
		WHERE dialog_id=$1 AND seq > $2 ORDER BY seq LIMIT $3`, dialogID, afterSeq, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list messages: %w", err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return nil, false, fmt.Errorf("scan message: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list messages: %w", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// MarkOutboxDelivered records that the request path published an event.
func (s *Store) MarkOutboxDelivered(ctx context.Context, eventID string) error {
	_, err := s.reqExec(ctx, "UPDATE outbox SET delivered_at = now(), attempts = attempts + 1 WHERE event_id=$1 AND delivered_at IS NULL", eventID)
	if err != nil {
		return fmt.Errorf("mark outbox delivered: %w", err)
	}
	return nil
}
