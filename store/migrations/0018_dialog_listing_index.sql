-- The dialog listing's index, over the copy of each dialog's created_at
-- that every membership carries (the previous migration added it, with the
-- trigger that fills it in for new memberships): the memberships that
-- existed before are filled in, then the index is built.
--
-- A migration of its own, so that it does not hold dialog_members
-- exclusively (but for the repair below): the backfill takes row locks
-- (reads, inserts and listing go on), the index build a SHARE lock (reads
-- go on; membership inserts, that is dialog creation, wait for the build). On a large table the backfill
-- still takes long in one transaction (one million memberships took about
-- a minute on a two-core test machine, longer than the gateway's own
-- migration at start allows): do it first by hand, in batches, and build
-- the index concurrently (docs/runbook-postgres.md, "Dialog listing
-- index"); this migration then updates no row and finds the index built.

-- One UPDATE: inside this transaction, batches would hold the same locks
-- until the same commit. The batched backfill is the runbook's, by hand.
UPDATE dialog_members m SET dialog_created_at = d.created_at
    FROM dialogs d
    WHERE d.id = m.dialog_id AND m.dialog_created_at IS NULL;

-- A concurrent build by hand that was cut short leaves an invalid index
-- under the name, which PostgreSQL never uses: it is built again here. Its
-- DROP INDEX holds dialog_members exclusively (reads too) until this
-- transaction commits, the one case where this migration does; the
-- runbook says to drop such an index concurrently by hand first.
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
