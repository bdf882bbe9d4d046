-- The dialog listing pages a user's dialogs newest first by the dialog's
-- (created_at, id). Until now no index held one user's dialogs in that
-- order: every page read all of the user's memberships and their dialogs
-- and sorted them, so a page cost grew with the user's dialogs and paging
-- through them all with their square. Each membership now carries a copy of
-- its dialog's created_at, and dialog_members_listing_idx holds a user's
-- memberships in listing order: a page reads its limit + 1 entries of the
-- index and nothing else of the user's (store.ListDialogs).
--
-- A dialog's created_at is its creation time and is never changed. The
-- copy is written with the membership: CreateDialog sets it, and the
-- trigger fills it in for an insert that leaves it out (the previous
-- release, which keeps serving during a rolling upgrade, or a row added by
-- hand) from the dialog the membership references.
--
-- This migration runs as one transaction: from the ADD COLUMN to the
-- commit it holds dialog_members exclusively, so every membership check and
-- listing waits for the backfill and the index build. That is a moment on
-- a small table. On a large one do each step by hand first, without
-- holding the table (docs/runbook-postgres.md, "Dialog listing index"):
-- every step below is skipped when it is done already, and the backfill
-- then updates no row.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'dialog_members'::regclass AND attname = 'dialog_created_at' AND NOT attisdropped) THEN
        -- Nullable and without a default: no table rewrite.
        ALTER TABLE dialog_members ADD COLUMN dialog_created_at timestamptz;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION dialog_members_fill_created_at() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.dialog_created_at IS NULL THEN
        SELECT d.created_at INTO NEW.dialog_created_at FROM dialogs d WHERE d.id = NEW.dialog_id;
    END IF;
    RETURN NEW;
END
$$;

-- Before the backfill: a membership inserted while it runs (by hand, in
-- batches) is filled in by the trigger.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'dialog_members'::regclass AND tgname = 'dialog_members_fill_created_at') THEN
        CREATE TRIGGER dialog_members_fill_created_at BEFORE INSERT ON dialog_members
            FOR EACH ROW EXECUTE FUNCTION dialog_members_fill_created_at();
    END IF;
END
$$;

-- One UPDATE: inside this transaction, batches would hold the same locks
-- until the same commit. The batched backfill is the runbook's, by hand.
UPDATE dialog_members m SET dialog_created_at = d.created_at
    FROM dialogs d
    WHERE d.id = m.dialog_id AND m.dialog_created_at IS NULL;

-- A concurrent build by hand that was cut short leaves an invalid index
-- under the name, which PostgreSQL never uses: it is built again here.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('dialog_members_listing_idx') AND NOT indisvalid) THEN
        DROP INDEX dialog_members_listing_idx;
    END IF;
    IF to_regclass('dialog_members_listing_idx') IS NULL THEN
        CREATE INDEX dialog_members_listing_idx
            ON dialog_members (user_id, dialog_created_at DESC, dialog_id DESC);
    END IF;
END
$$;
