-- Runtime settings versioned in PostgreSQL (docs/runtime-settings.md) and
-- the legacy DB2 safety stub's recovery guard (docs/legacy-stub.md).

-- The settings version: one row whose counter every change of a settings
-- table increments in the changing transaction. Writers serialise on this
-- row, so versions become visible in commit order and a reader that saw
-- version N has seen every change up to N.
CREATE TABLE settings_head (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    version    bigint NOT NULL CHECK (version > 0),
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO settings_head (version) VALUES (1);

-- History: which statement produced each version.
CREATE TABLE settings_versions (
    version    bigint PRIMARY KEY,
    change     text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO settings_versions (version, change) VALUES (1, 'initial');

-- Rate-limit policy overrides, one row per route label ("METHOD /template"
-- of the router, or "other"). A route without a row keeps its built-in
-- policy (ratelimit.DefaultPolicies); deleting a row restores it. rules is
-- a JSON array of {"family","limit","windowMs"}; an empty array means the
-- route is not limited.
CREATE TABLE rate_limit_policies (
    route      text PRIMARY KEY CHECK (route = 'other' OR route ~ '^[A-Z]+ /'),
    algorithm  text NOT NULL CHECK (algorithm IN ('sliding', 'fixed', 'bucket')),
    on_failure text NOT NULL DEFAULT 'local' CHECK (on_failure IN ('local', 'fail-closed')),
    rules      jsonb NOT NULL CHECK (jsonb_typeof(rules) = 'array'),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Other tunables: name → JSON value (docs/runtime-settings.md lists the
-- names the service reads).
CREATE TABLE runtime_settings (
    name       text PRIMARY KEY CHECK (name ~ '^[a-z0-9_.]{1,64}$'),
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION settings_bump() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v bigint;
BEGIN
    UPDATE settings_head SET version = version + 1, changed_at = now() RETURNING version INTO v;
    INSERT INTO settings_versions (version, change) VALUES (v, TG_TABLE_NAME || ' ' || TG_OP);
    RETURN NULL;
END
$$;

CREATE TRIGGER rate_limit_policies_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON rate_limit_policies FOR EACH STATEMENT EXECUTE FUNCTION settings_bump();
CREATE TRIGGER runtime_settings_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON runtime_settings FOR EACH STATEMENT EXECUTE FUNCTION settings_bump();

-- Legacy safety stub tasks: one per message sent while the stub is enabled
-- (the task id is the message id), written in the send transaction. The
-- Redis task in DB2 (han:stub:task:{<message_id>}) is the poll state; this
-- row is the durable verdict and the recovery guard: a recoverer may decide
-- a stuck task only while it holds the lease (lease_owner, lease_until).
CREATE TABLE stub_tasks (
    message_id  uuid PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    verdict     text CHECK (verdict IN ('approved', 'rejected')),
    decided_by  text CHECK (decided_by IN ('poll', 'recovery')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    decided_at  timestamptz,
    lease_owner text,
    lease_until timestamptz,
    recoveries  integer NOT NULL DEFAULT 0,
    CHECK ((state = 'done') = (verdict IS NOT NULL))
);
CREATE INDEX stub_tasks_pending_idx ON stub_tasks (created_at) WHERE state = 'pending';
