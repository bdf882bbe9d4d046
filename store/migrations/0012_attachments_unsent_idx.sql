-- Uploaded attachments that no message ever linked are deleted, with their
-- blobs, once older than HAN_ATTACHMENT_UNSENT_TTL (the janitor,
-- store.PurgeUnsentAttachments). This partial index holds exactly those
-- rows, in upload order, so each purge batch reads only the rows it
-- removes instead of scanning every attachment. A row enters it when its
-- upload completes and leaves it when a message links it: the attachments
-- of sent messages, nearly all of them, never sit in it.
--
-- On a large attachments table build it first by hand without blocking
-- writes:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS attachments_unsent_idx
--       ON attachments (uploaded_at) WHERE status = 'uploaded' AND message_id IS NULL;
CREATE INDEX IF NOT EXISTS attachments_unsent_idx ON attachments (uploaded_at)
    WHERE status = 'uploaded' AND message_id IS NULL;
