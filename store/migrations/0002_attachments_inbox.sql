-- Attachments (docs/api.md), internal inbox receipts, and the indexes the
-- idempotency janitor needs. idempotency_records itself is in 0001.

-- An attachment is created by POST /v1/attachments (status 'pending'), its
-- bytes arrive through the signed PUT (status 'uploaded', blob_key names the
-- blob in the blob store), and a message send links it (message_id).
CREATE TABLE attachments (
    id                uuid PRIMARY KEY,
    dialog_id         uuid NOT NULL REFERENCES dialogs(id) ON DELETE CASCADE,
    uploader_id       uuid NOT NULL REFERENCES users(id),
    filename          text NOT NULL,
    content_type      text NOT NULL,
    size_bytes        bigint NOT NULL CHECK (size_bytes > 0),
    status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'uploaded')),
    upload_expires_at timestamptz NOT NULL,
    blob_key          text,
    sha256            text,
    message_id        uuid REFERENCES messages(id) ON DELETE SET NULL,
    position          integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    uploaded_at       timestamptz
);
CREATE INDEX attachments_message_idx ON attachments (message_id, position) WHERE message_id IS NOT NULL;
CREATE INDEX attachments_pending_idx ON attachments (upload_expires_at) WHERE status = 'pending';

-- Durable receipts of POST /v1/internal/inbox, idempotent by (service, id).
-- The realtime event goes through the outbox in the same transaction.
CREATE TABLE inbox_receipts (
    service     text NOT NULL,
    id          text NOT NULL,
    kind        text NOT NULL,
    dialog_id   uuid REFERENCES dialogs(id) ON DELETE CASCADE,
    user_id     uuid REFERENCES users(id),
    fingerprint text NOT NULL,
    event_id    uuid NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service, id),
    CHECK ((dialog_id IS NULL) <> (user_id IS NULL))
);
