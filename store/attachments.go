package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/encoding/json"
)

// Attachment errors the API maps to stable codes.
var (
	ErrAttachmentNotFound    = errors.New("store: attachment not found")
	ErrInvalidAttachment     = errors.New("store: invalid attachment")
	ErrAttachmentNotUploaded = errors.New("store: attachment not uploaded")
	ErrAttachmentUploaded    = errors.New("store: attachment already uploaded")
)

// Attachment statuses.
const (
	AttachmentPending  = "pending"
	AttachmentUploaded = "uploaded"
)

// Attachment is a file a dialog member announced (POST /v1/attachments) and
// then uploaded through a signed URL.
type Attachment struct {
	ID              string
	DialogID        string
	UploaderID      string
	Filename        string
	ContentType     string
	SizeBytes       int64
	Status          string
	UploadExpiresAt time.Time
	BlobKey         string // "" until uploaded
	SHA256          string // hex, "" until uploaded
	MessageID       string // "" until a message links it
	CreatedAt       time.Time
}

// AttachmentRef is an attachment as a message carries it.
type AttachmentRef struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"contentType"`
	SizeBytes   int64  `json:"sizeBytes"`
}

// MaxMessageAttachments is the most attachments one message may link.
const MaxMessageAttachments = 10

// attachmentsColumn is the message's attachments as a JSON array text, in
// the order the sender gave them (one index probe per message).
const attachmentsColumn = `COALESCE((SELECT jsonb_agg(jsonb_build_object('id', a.id::text, 'filename', a.filename,
	'contentType', a.content_type, 'sizeBytes', a.size_bytes) ORDER BY a.position)
	FROM attachments a WHERE a.message_id = messages.id), '[]'::jsonb)::text`

func decodeAttachmentRefs(raw string) ([]AttachmentRef, error) {
	if raw == "" || raw == "[]" {
		return nil, nil
	}
	var refs []AttachmentRef
	if err := json.Unmarshal([]byte(raw), &refs); err != nil {
		return nil, fmt.Errorf("decode attachments: %w", err)
	}
	return refs, nil
}

// CreateAttachment is the input of Store.CreateAttachment.
type CreateAttachment struct {
	ID          string
	DialogID    string
	UploaderID  string
	Filename    string
	ContentType string
	SizeBytes   int64
	// UploadTTL is the upload URL's lifetime from the insert's now().
	UploadTTL time.Duration
	// Idem, when set, is the request's idempotency record, written in the
	// same transaction.
	Idem *IdemWrite[Attachment]
}

// CreateAttachment records a pending attachment of a dialog the uploader is
// a member of (ErrDialogNotFound otherwise). The upload deadline is
// truncated to the millisecond so signed URLs rebuilt from it match.
func (s *Store) CreateAttachment(ctx context.Context, in CreateAttachment) (Attachment, error) {
	var a Attachment
	err := s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var member bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM dialog_members WHERE dialog_id=$1 AND user_id=$2)",
			in.DialogID, in.UploaderID).Scan(&member); err != nil {
			return err
		}
		if !member {
			return ErrDialogNotFound
		}
		row := tx.QueryRow(ctx, `INSERT INTO attachments(id, dialog_id, uploader_id, filename, content_type, size_bytes, upload_expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, date_trunc('milliseconds', now() + $7 * interval '1 millisecond'))
			RETURNING `+attachmentCols, in.ID, in.DialogID, in.UploaderID, in.Filename, in.ContentType, in.SizeBytes, in.UploadTTL.Milliseconds())
		var err error
		if a, err = scanAttachment(row); err != nil {
			return err
		}
		return in.Idem.insert(ctx, tx, a)
	})
	if err != nil {
		if errors.Is(err, ErrDialogNotFound) || errors.Is(err, ErrIdemExists) {
			return Attachment{}, err
		}
		return Attachment{}, fmt.Errorf("create attachment: %w", err)
	}
	return a, nil
}

const attachmentCols = `id::text, dialog_id::text, uploader_id::text, filename, content_type, size_bytes, status,
	upload_expires_at, COALESCE(blob_key, ''), COALESCE(sha256, ''), COALESCE(message_id::text, ''), created_at`

func scanAttachment(row pgx.Row) (Attachment, error) {
	var a Attachment
	err := row.Scan(&a.ID, &a.DialogID, &a.UploaderID, &a.Filename, &a.ContentType, &a.SizeBytes, &a.Status,
		&a.UploadExpiresAt, &a.BlobKey, &a.SHA256, &a.MessageID, &a.CreatedAt)
	return a, err
}

// GetAttachment loads an attachment by id (ErrAttachmentNotFound).
func (s *Store) GetAttachment(ctx context.Context, id string) (Attachment, error) {
	a, err := scanAttachment(s.reqQueryRow(ctx, `SELECT `+attachmentCols+` FROM attachments WHERE id=$1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Attachment{}, ErrAttachmentNotFound
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("load attachment: %w", err)
	}
	return a, nil
}

// AttachmentForMember loads an attachment if userID is a member of its
// dialog; otherwise it is reported as ErrAttachmentNotFound (no existence
// leak).
func (s *Store) AttachmentForMember(ctx context.Context, id, userID string) (Attachment, error) {
	a, err := scanAttachment(s.reqQueryRow(ctx, `SELECT `+attachmentCols+` FROM attachments
		WHERE id=$1 AND EXISTS (SELECT 1 FROM dialog_members m WHERE m.dialog_id = attachments.dialog_id AND m.user_id=$2)`, id, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Attachment{}, ErrAttachmentNotFound
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("load attachment: %w", err)
	}
	return a, nil
}

// ErrUploadOutcomeUnknown marks the failure of MarkAttachmentUploaded's
// write when PostgreSQL may have applied it all the same: its COMMIT was
// sent and no answer came back (the connection dropped, or the request
// ended while waiting). The row may say uploaded with the caller's blob
// key, so the caller must keep that blob; if the write did not land, the
// blob is an orphan the janitor's sweep deletes.
var ErrUploadOutcomeUnknown = errors.New("store: attachment upload outcome unknown")

// MarkAttachmentUploaded records the blob of a pending attachment. When the
// attachment was no longer pending (a concurrent or earlier upload won), it
// returns ErrAttachmentUploaded with the current row so the caller can
// compare contents and delete its own blob. Any other failure either means
// nothing was written (the caller may delete its blob) or is wrapped in
// ErrUploadOutcomeUnknown (it must not).
//
// It is a request transaction, not a single statement, so the server
// itself bounds it (lock_timeout, statement_timeout): an UPDATE whose
// client gave up cannot wait on a lock and commit long afterwards, when
// the orphan sweep may already have taken its blob for an orphan. And only
// a failed COMMIT can leave the outcome unknown: a failure before it rolls
// the transaction back.
func (s *Store) MarkAttachmentUploaded(ctx context.Context, id, blobKey, sha256 string) (Attachment, error) {
	var a Attachment
	lost := false       // the attachment was not pending: nothing to write
	committing := false // the UPDATE applied; what fails after it is the COMMIT
	err := s.requestTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		a, err = scanAttachment(tx.QueryRow(ctx, `UPDATE attachments SET status='uploaded', blob_key=$2, sha256=$3, uploaded_at=now()
			WHERE id=$1 AND status='pending' RETURNING `+attachmentCols, id, blobKey, sha256))
		if errors.Is(err, pgx.ErrNoRows) {
			lost = true
			a, err = scanAttachment(tx.QueryRow(ctx, `SELECT `+attachmentCols+` FROM attachments WHERE id=$1`, id))
		}
		committing = err == nil && !lost
		return err
	})
	switch {
	case err == nil && lost:
		return a, ErrAttachmentUploaded
	case err == nil:
		return a, nil
	case errors.Is(err, pgx.ErrNoRows):
		return Attachment{}, ErrAttachmentNotFound
	case committing && commitMayHaveApplied(err):
		return Attachment{}, fmt.Errorf("mark attachment uploaded: %w: %w", ErrUploadOutcomeUnknown, err)
	}
	return Attachment{}, fmt.Errorf("mark attachment uploaded: %w", err)
}

// commitMayHaveApplied reports whether a COMMIT that failed with err may
// have committed all the same. It is false only when PostgreSQL is known
// to have committed nothing: the COMMIT was never sent
// (pgconn.SafeToRetry), the server answered it with an error, or it
// answered that it rolled the transaction back. A lost answer (a dropped
// connection, a request that ended while waiting) or a FATAL that ended
// the session may come after the commit.
func commitMayHaveApplied(err error) bool {
	if pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		sev := pe.SeverityUnlocalized
		if sev == "" {
			sev = pe.Severity
		}
		return sev != "ERROR"
	}
	return true
}

// PurgeAbandonedAttachments deletes pending attachments whose upload URL
// expired more than retention ago, in batches; they never had a blob.
func (s *Store) PurgeAbandonedAttachments(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	var total int64
	for {
		// The outer conditions repeat the inner ones: a row whose state
		// changed after the subquery read it is re-checked, not deleted.
		tag, err := s.pool.Exec(ctx, `DELETE FROM attachments WHERE id = ANY(ARRAY(
			SELECT id FROM attachments WHERE status='pending' AND upload_expires_at < now() - $1 * interval '1 millisecond'
			LIMIT $2)) AND status='pending' AND upload_expires_at < now() - $1 * interval '1 millisecond'`, retention.Milliseconds(), batch)
		if err != nil {
			return total, fmt.Errorf("purge attachments: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// PurgeUnsentAttachments deletes uploaded attachments that no message
// links, that were uploaded more than retention ago and whose upload URL
// expired more than replay ago, in batches, then their blobs through
// blobs; it returns how many rows it deleted. Without it, an upload the
// user removed from the composer, a failed send or a script would keep its
// blob forever and fill the disk at the init rate limit. replay is the
// idempotency record TTL, as for PurgeAbandonedAttachments: until the
// record of the init is gone, a replay of the init re-reads the attachment
// and must find it, however short retention is.
//
// The row goes first: the send locks the attachment rows it links and
// re-checks message_id IS NULL under the lock, so a send either commits
// first (the DELETE re-checks the row, finds it linked and keeps it) or
// finds the row gone (400 invalid_attachment). Deleting the blob first
// could leave a message whose attachment has no bytes. A blob whose
// delete fails is left behind, counted in the error; no row refers to it
// any more, and the janitor's orphan sweep deletes it later.
func (s *Store) PurgeUnsentAttachments(ctx context.Context, blobs BlobStore, retention, replay time.Duration, batch int) (int64, error) {
	var total int64
	var blobErr error
	for {
		// The outer conditions repeat the inner ones: a row a send linked
		// after the subquery read it is re-checked, not deleted.
		rows, err := s.pool.Query(ctx, `DELETE FROM attachments WHERE id = ANY(ARRAY(
			SELECT id FROM attachments WHERE status='uploaded' AND message_id IS NULL
				AND uploaded_at < now() - $1 * interval '1 millisecond'
				AND upload_expires_at < now() - $3 * interval '1 millisecond'
			LIMIT $2)) AND status='uploaded' AND message_id IS NULL AND uploaded_at < now() - $1 * interval '1 millisecond'
			AND upload_expires_at < now() - $3 * interval '1 millisecond'
			RETURNING COALESCE(blob_key, '')`, retention.Milliseconds(), batch, replay.Milliseconds())
		if err != nil {
			return total, fmt.Errorf("purge unsent attachments: %w", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return total, fmt.Errorf("purge unsent attachments: %w", err)
		}
		total += int64(len(keys))
		for _, k := range keys {
			if k == "" {
				continue
			}
			if err := blobs.Delete(ctx, k); err != nil && blobErr == nil {
				blobErr = fmt.Errorf("purge unsent attachments: %w", err)
			}
		}
		if len(keys) < batch {
			return total, blobErr
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
