package store

import (
	"context"
	"fmt"
	"time"
)

// RecoveredEvent is one message of a dialog as the socket would replay it.
type RecoveredEvent struct {
	Seq int64
	// Frame is the message.created frame under its outbox event id: the
	// bytes the send path published. Nil when the message cannot be
	// replayed: its outbox row is older than the window, purged, or it never
	// had one.
	Frame []byte
}

// DialogRecovery is what RecoverDialog read in one snapshot.
type DialogRecovery struct {
	LastSeq int64            // the dialog's last assigned seq
	Events  []RecoveredEvent // ascending seq, the newest messages after afterSeq
	// Complete: Events holds every message after afterSeq (fewer than
	// limit existed, and the read did not stop at maxBytes).
	Complete bool
}

// RecoverDialog reads, in one statement, the dialog's last seq and its
// newest limit messages with seq > afterSeq with their message.created
// frames, as far as their outbox rows were written within window. The
// frames are bounded by maxBytes as they are built, newest first: the read
// stops at the message whose frame takes their total past maxBytes, and
// returns it without its frame (a replay that needs it is over the bound
// whatever else it holds) and not Complete. So a read builds and keeps at
// most maxBytes of frames, however long the bodies. It does not check
// membership (the caller did). ErrDialogNotFound if there is no such
// dialog.
func (s *Store) RecoverDialog(ctx context.Context, dialogID string, afterSeq int64, window time.Duration,
	limit, maxBytes int) (DialogRecovery, error) {
	rows, err := s.pool.Query(ctx, `SELECT d.last_seq, x.seq, x.event_id, x.fresh, x.id, x.sender_id, x.body, x.created_at, x.atts
		FROM dialogs d LEFT JOIN LATERAL (
			SELECT messages.seq, COALESCE(o.event_id::text, '') AS event_id,
				COALESCE(o.created_at >= now() - make_interval(secs => $3), false) AS fresh,
				messages.id::text AS id, messages.sender_id::text AS sender_id, messages.body, messages.created_at,
				`+attachmentsColumn+` AS atts
			FROM messages LEFT JOIN outbox o ON o.message_id = messages.id
			WHERE messages.dialog_id = d.id AND messages.seq > $2
			ORDER BY messages.seq DESC LIMIT $4) x ON true
		WHERE d.id = $1`, dialogID, afterSeq, window.Seconds(), limit)
	if err != nil {
		return DialogRecovery{}, fmt.Errorf("recover dialog: %w", err)
	}
	var out DialogRecovery
	found, stopped, size := false, false, 0
	for !stopped && rows.Next() {
		found = true
		var (
			seq                             *int64
			eventID, id, sender, body, atts *string
			fresh                           *bool
			created                         *time.Time
		)
		if err := rows.Scan(&out.LastSeq, &seq, &eventID, &fresh, &id, &sender, &body, &created, &atts); err != nil {
			rows.Close()
			return DialogRecovery{}, fmt.Errorf("recover dialog: %w", err)
		}
		if seq == nil {
			continue
		}
		ev := RecoveredEvent{Seq: *seq}
		if *fresh && *eventID != "" {
			m := Message{ID: *id, DialogID: dialogID, Seq: *seq, SenderID: *sender, Body: *body, CreatedAt: *created}
			if m.Attachments, err = decodeAttachmentRefs(*atts); err != nil {
				rows.Close()
				return DialogRecovery{}, fmt.Errorf("recover dialog: %w", err)
			}
			oe, err := messageCreatedEvent(*eventID, m)
			if err != nil {
				rows.Close()
				return DialogRecovery{}, fmt.Errorf("recover dialog: %w", err)
			}
			if size += len(oe.Payload); size > maxBytes {
				stopped = true // the older messages are not read
			} else {
				ev.Frame = oe.Payload
			}
		}
		out.Events = append(out.Events, ev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return DialogRecovery{}, fmt.Errorf("recover dialog: %w", err)
	}
	if !found {
		return DialogRecovery{}, ErrDialogNotFound
	}
	for i, j := 0, len(out.Events)-1; i < j; i, j = i+1, j-1 {
		out.Events[i], out.Events[j] = out.Events[j], out.Events[i]
	}
	out.Complete = !stopped && len(out.Events) < limit
	return out, nil
}
