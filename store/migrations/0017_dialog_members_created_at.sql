-- The dialog listing pages a user's dialogs newest first by the dialog's
-- (created_at, id). Each membership now carries a copy of its dialog's
-- created_at (this migration), and dialog_members_listing_idx holds a
-- user's memberships in listing order (the next one, which also fills the
-- copy in for the memberships that exist): a page then reads its limit + 1
-- entries of the index and nothing else of the user's (store.ListDialogs).
--
-- A dialog's created_at is its creation time and is never changed. The
-- copy is written with the membership: CreateDialog sets it, and the
-- trigger fills it in for an insert that leaves it out (the previous
-- release, which keeps serving during a rolling upgrade, or a row added by
-- hand) from the dialog the membership references.
--
-- This migration changes only the catalog (a nullable column without a
-- default is no table rewrite): it holds dialog_members exclusively for a
-- moment, once the transactions using the table have ended.
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
