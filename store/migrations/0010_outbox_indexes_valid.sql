-- outbox_delivered_idx and outbox_message_idx may have been built by hand
-- with CREATE INDEX CONCURRENTLY before 0006 and 0008 ran (the way to add
-- them to a large outbox without blocking writes). A concurrent build that
-- was interrupted leaves an INVALID index under the name, which
-- CREATE INDEX IF NOT EXISTS takes as done, and PostgreSQL never uses an
-- invalid index: the outbox purge and the socket's recovery reads would
-- scan the outbox. Such an index is built again here, as 0006 and 0008
-- build it (writes to the outbox wait for the build).
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('outbox_delivered_idx') AND NOT indisvalid) THEN
    DROP INDEX outbox_delivered_idx;
    CREATE INDEX outbox_delivered_idx ON outbox (delivered_at) WHERE delivered_at IS NOT NULL;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('outbox_message_idx') AND NOT indisvalid) THEN
    DROP INDEX outbox_message_idx;
    CREATE INDEX outbox_message_idx ON outbox (message_id) WHERE message_id IS NOT NULL;
  END IF;
END
$$;
