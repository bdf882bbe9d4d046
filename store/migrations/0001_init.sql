-- Foundation schema: users, dialogs, messages, idempotency, outbox, projects.
CREATE TABLE users (
    id           uuid PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz
);

CREATE TABLE dialogs (
    id         uuid PRIMARY KEY,
    title      text NOT NULL DEFAULT '',
    created_by uuid NOT NULL REFERENCES users(id),
    last_seq   bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dialog_members (
    dialog_id uuid NOT NULL REFERENCES dialogs(id) ON DELETE CASCADE,
    user_id   uuid NOT NULL REFERENCES users(id),
    joined_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dialog_id, user_id)
);
CREATE INDEX dialog_members_user_idx ON dialog_members (user_id, dialog_id);

-- seq is assigned inside the sending transaction by incrementing
-- dialogs.last_seq under its row lock: gapless and unique per dialog.
CREATE TABLE messages (
    id                uuid PRIMARY KEY,
    dialog_id         uuid NOT NULL REFERENCES dialogs(id) ON DELETE CASCADE,
    seq               bigint NOT NULL,
    sender_id         uuid NOT NULL REFERENCES users(id),
    body              text NOT NULL,
    client_message_id text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (dialog_id, seq)
);
CREATE UNIQUE INDEX messages_client_id_idx ON messages (dialog_id, sender_id, client_message_id)
    WHERE client_message_id IS NOT NULL;

-- Durable idempotency fallback (docs/idempotency.md): written in the business
-- transaction; Redis is only the accelerator.
CREATE TABLE idempotency_records (
    scope       text NOT NULL,
    user_id     uuid NOT NULL,
    key_hmac    text NOT NULL,
    fingerprint text NOT NULL,
    status      integer NOT NULL,
    resource_id text NOT NULL DEFAULT '',
    version     bigint NOT NULL DEFAULT 0,
    meta        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, user_id, key_hmac)
);
CREATE INDEX idempotency_records_expires_idx ON idempotency_records (expires_at);

-- Transactional outbox: one row per realtime event, published after commit
-- by the request path or, failing that, by the relay.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    event_id     uuid NOT NULL UNIQUE,
    channel      text NOT NULL,
    payload      bytea NOT NULL,
    entity_id    text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    attempts     integer NOT NULL DEFAULT 0
);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE delivered_at IS NULL;

CREATE TABLE projects (
    id                   uuid PRIMARY KEY,
    name                 text NOT NULL,
    cache_quota_bytes    bigint NOT NULL DEFAULT 1048576,
    delivery_paused      boolean NOT NULL DEFAULT false,
    legacy_deadline_ms   bigint,
    created_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE project_members (
    project_id uuid NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES users(id),
    role       text NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    PRIMARY KEY (project_id, user_id)
);
