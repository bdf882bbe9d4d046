-- The socket's recovery reads the outbox rows of a dialog's recent messages
-- by message_id (the message.created rows name their message); without
-- this index every recovery would scan the outbox.
CREATE INDEX IF NOT EXISTS outbox_message_idx ON outbox (message_id) WHERE message_id IS NOT NULL;
