package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrInboxConflict means an inbox id was sent again with other content.
var ErrInboxConflict = errors.New("store: inbox id reused with other content")

// InboxItem is one POST /v1/internal/inbox request. Exactly one of
// DialogID and UserID is set.
type InboxItem struct {
	Service     string // the calling service (the token's svc claim)
	ID          string // the caller's id of the item: the idempotency key
	Kind        string
	DialogID    string
	UserID      string
	Fingerprint string // of kind, target and data, to tell a retry from a reuse
	EventID     string // the realtime event's id if this item is new
	// Event builds the realtime event of the receipt; it is written to the
	// outbox in the same transaction.
	Event func(InboxReceipt) (OutboxEvent, error)
}

// InboxReceipt is the durable receipt of an inbox item.
type InboxReceipt struct {
	Service    string
	ID         string
	Kind       string
	DialogID   string
	UserID     string
	EventID    string
	ReceivedAt time.Time
}

// AcceptInbox stores the receipt and its outbox event in one transaction.
// The same (service, id) again returns the stored receipt with created=false
// and writes nothing, or ErrInboxConflict when the content differs. An
// unknown dialog or user is ErrDialogNotFound / ErrUserNotFound.
func (s *Store) AcceptInbox(ctx context.Context, in InboxItem) (InboxReceipt, OutboxEvent, bool, error) {
	r, ev, created, err := s.acceptInbox(ctx, in)
	if isUniqueViolation(err, "inbox_receipts_pkey") {
		// A concurrent delivery of the same id won: answer from it.
		r, ev, created, err = s.acceptInbox(ctx, in)
	}
	return r, ev, created, err
}

func (s *Store) acceptInbox(ctx context.Context, in InboxItem) (r InboxReceipt, ev OutboxEvent, created bool, err error) {
	err = s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var dialog, user *string
		if in.DialogID != "" {
			dialog = &in.DialogID
		} else {
			user = &in.UserID
		}
		var fp string
		err := tx.QueryRow(ctx, `SELECT `+inboxCols+`, fingerprint FROM inbox_receipts WHERE service=$1 AND id=$2`,
			in.Service, in.ID).Scan(&r.Service, &r.ID, &r.Kind, &r.DialogID, &r.UserID, &r.EventID, &r.ReceivedAt, &fp)
		if err == nil {
			if fp != in.Fingerprint {
				return ErrInboxConflict
			}
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var exists bool
		if dialog != nil {
			err = tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM dialogs WHERE id=$1)", in.DialogID).Scan(&exists)
		} else {
			err = tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM users WHERE id=$1)", in.UserID).Scan(&exists)
		}
		if err != nil {
			return err
		}
		if !exists && dialog != nil {
			return ErrDialogNotFound
		}
		if !exists {
			return ErrUserNotFound
		}
		err = tx.QueryRow(ctx, `INSERT INTO inbox_receipts(service, id, kind, dialog_id, user_id, fingerprint, event_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+inboxCols,
			in.Service, in.ID, in.Kind, dialog, user, in.Fingerprint, in.EventID).
			Scan(&r.Service, &r.ID, &r.Kind, &r.DialogID, &r.UserID, &r.EventID, &r.ReceivedAt)
		if err != nil {
			return err
		}
		if in.Event != nil {
			e, err := in.Event(r)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO outbox(event_id, channel, payload, entity_id) VALUES ($1,$2,$3,$4)",
				e.EventID, e.Channel, e.Payload, e.EntityID); err != nil {
				return err
			}
			ev = e
		}
		created = true
		return nil
	})
	if err != nil {
		switch {
		case errors.Is(err, ErrInboxConflict), errors.Is(err, ErrDialogNotFound), errors.Is(err, ErrUserNotFound),
			isUniqueViolation(err, "inbox_receipts_pkey"):
			return InboxReceipt{}, OutboxEvent{}, false, err
		}
		return InboxReceipt{}, OutboxEvent{}, false, fmt.Errorf("accept inbox item: %w", err)
	}
	return r, ev, created, nil
}

const inboxCols = `service, id, kind, COALESCE(dialog_id::text, ''), COALESCE(user_id::text, ''), event_id::text, received_at`

func isUniqueViolation(err error, constraint string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == constraint
}
