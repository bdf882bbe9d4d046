-- The send path in one statement: send_messages writes a batch of messages
-- of one dialog (one message or many that one instance combined) in the
-- statement's own transaction, so the dialog's row lock is held only while
-- the server runs the function and commits, never across a client round
-- trip.

-- The outbox row of a message.created event names its message; its frame
-- is not stored but built from the message whenever it is published (the
-- request path after the commit, the relay later), under the row's event
-- id, so every build gives the same bytes. payload stays empty for such
-- rows.
ALTER TABLE outbox ADD COLUMN message_id uuid;

-- send_messages sends the messages at the same index of its arrays into
-- p_dialog, in array order. For each message i:
--   p_ids[i], p_senders[i], p_bodies[i]: the message;
--   p_cmids[i]: its clientMessageId, '' for none;
--   p_att_counts[i]: how many of p_att_ids (laid out message after message)
--     are its attachments, in the sender's order;
--   p_event_ids[i]: the event id of its message.created outbox row on
--     p_channel, '' for none;
--   p_safety[i]: whether to record its pending safety task;
--   p_idem_keys[i]: the HMAC of its idempotency key, '' for none, with
--     p_idem_scopes[i], p_idem_fps[i], p_idem_status[i], p_idem_meta[i] and
--     p_idem_ttl_ms[i]; the record's resource is the message and its
--     version the message's seq.
-- It returns one row per message (r_ord = i) with r_outcome:
--   created: committed with seq r_seq at r_created_at, r_attachments its
--     attachments (JSON array text);
--   duplicate: the sender's clientMessageId was already used in this dialog:
--     the r_* columns are that message, or r_ref names the earlier message
--     of this batch that holds it; nothing written;
--   not_member: the sender is not a member of the dialog (or there is no
--     such dialog); invalid_attachment: an attachment is not an uploaded,
--     unlinked attachment of the dialog by the sender (or is one an earlier
--     message of the batch links); idem_exists: a live idempotency record
--     holds the key. Nothing of such a message is written, and it takes no
--     seq.
-- Seqs are given in array order to the created messages only: gapless.
-- Membership is read before the dialog row lock is taken; everything that
-- another send into the same dialog could change (clientMessageIds,
-- attachment links, last_seq) is read under it. p_lock_timeout_ms bounds
-- each lock wait of the call (lock_timeout, for this transaction only).
CREATE FUNCTION send_messages(
    p_dialog uuid, p_channel text, p_lock_timeout_ms bigint,
    p_ids uuid[], p_senders uuid[], p_bodies text[], p_cmids text[],
    p_att_counts int[], p_att_ids uuid[], p_event_ids text[], p_safety boolean[],
    p_idem_scopes text[], p_idem_keys text[], p_idem_fps text[], p_idem_status int[],
    p_idem_meta text[], p_idem_ttl_ms bigint[])
RETURNS TABLE (r_ord int, r_outcome text, r_ref int, r_id text, r_seq bigint, r_sender text, r_body text,
    r_cmid text, r_created_at timestamptz, r_attachments text)
LANGUAGE plpgsql AS $$
DECLARE
    n int := cardinality(p_ids);
    v_members uuid[];
    v_last bigint;
    v_first bigint;
    v_now timestamptz := now();
    v_off int := 0;
    v_atts uuid[];
    v_cnt int;
    v_json text;
    v_ref int;
    v_claimed uuid[] := '{}';
    v_keys text[] := '{}';
    c_ord int[] := '{}';
    c_atts text[] := '{}';
    c_cmkeys text[] := '{}';
    a_ids uuid[] := '{}';
    a_msg uuid[] := '{}';
    a_pos int[] := '{}';
    i int;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    SELECT array_agg(m.user_id) INTO v_members FROM dialog_members m
        WHERE m.dialog_id = p_dialog AND m.user_id = ANY (p_senders);
    IF v_members IS NOT NULL THEN
        SELECT d.last_seq INTO v_last FROM dialogs d WHERE d.id = p_dialog FOR NO KEY UPDATE;
    END IF;
    v_first := v_last;
    FOR i IN 1 .. n LOOP
        v_atts := p_att_ids[v_off + 1 : v_off + p_att_counts[i]];
        v_off := v_off + p_att_counts[i];
        IF v_last IS NULL OR NOT (p_senders[i] = ANY (v_members)) THEN
            RETURN QUERY SELECT i, 'not_member', 0, '', 0::bigint, '', '', '', v_now, '[]';
            CONTINUE;
        END IF;
        IF p_cmids[i] <> '' THEN
            v_ref := array_position(c_cmkeys, p_senders[i]::text || ':' || p_cmids[i]);
            IF v_ref IS NOT NULL THEN
                RETURN QUERY SELECT i, 'duplicate', c_ord[v_ref], '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
            RETURN QUERY SELECT i, 'duplicate', 0, m.id::text, m.seq, m.sender_id::text, m.body, m.client_message_id,
                m.created_at, COALESCE((SELECT jsonb_agg(jsonb_build_object('id', a.id::text, 'filename', a.filename,
                    'contentType', a.content_type, 'sizeBytes', a.size_bytes) ORDER BY a.position)
                    FROM attachments a WHERE a.message_id = m.id), '[]'::jsonb)::text
                FROM messages m WHERE m.dialog_id = p_dialog AND m.sender_id = p_senders[i] AND m.client_message_id = p_cmids[i];
            IF FOUND THEN
                CONTINUE;
            END IF;
        END IF;
        v_json := '[]';
        IF cardinality(v_atts) > 0 THEN
            -- The rows are locked so that a concurrent delete either waits
            -- for this transaction or, committed first, leaves the row out.
            SELECT count(DISTINCT l.id), COALESCE(jsonb_agg(jsonb_build_object('id', l.id::text, 'filename', l.filename,
                    'contentType', l.content_type, 'sizeBytes', l.size_bytes) ORDER BY l.ord), '[]'::jsonb)::text
                INTO v_cnt, v_json
                FROM (SELECT a.id, a.filename, a.content_type, a.size_bytes, x.ord
                    FROM unnest(v_atts) WITH ORDINALITY AS x(id, ord) JOIN attachments a ON a.id = x.id
                    WHERE a.dialog_id = p_dialog AND a.uploader_id = p_senders[i] AND a.status = 'uploaded'
                        AND a.message_id IS NULL AND NOT (a.id = ANY (v_claimed))
                    FOR NO KEY UPDATE OF a) AS l;
            IF v_cnt <> cardinality(v_atts) THEN
                RETURN QUERY SELECT i, 'invalid_attachment', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
        END IF;
        IF p_idem_keys[i] <> '' THEN
            IF (p_idem_scopes[i] || ':' || p_senders[i]::text || ':' || p_idem_keys[i]) = ANY (v_keys) THEN
                RETURN QUERY SELECT i, 'idem_exists', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
            -- As InsertIdempotencyTx: an expired record with the key is
            -- replaced, a live one refuses the message.
            INSERT INTO idempotency_records AS r
                (scope, user_id, key_hmac, fingerprint, status, resource_id, version, meta, created_at, expires_at)
                VALUES (p_idem_scopes[i], p_senders[i], p_idem_keys[i], p_idem_fps[i], p_idem_status[i], p_ids[i]::text,
                    v_last + 1, p_idem_meta[i]::jsonb, v_now, v_now + p_idem_ttl_ms[i] * interval '1 millisecond')
                ON CONFLICT (scope, user_id, key_hmac) DO UPDATE SET
                    fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status, resource_id = EXCLUDED.resource_id,
                    version = EXCLUDED.version, meta = EXCLUDED.meta, created_at = EXCLUDED.created_at,
                    expires_at = EXCLUDED.expires_at
                WHERE r.expires_at <= now();
            GET DIAGNOSTICS v_cnt = ROW_COUNT;
            IF v_cnt = 0 THEN
                RETURN QUERY SELECT i, 'idem_exists', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
            v_keys := v_keys || (p_idem_scopes[i] || ':' || p_senders[i]::text || ':' || p_idem_keys[i]);
        END IF;
        v_last := v_last + 1;
        c_ord := c_ord || i;
        c_atts := c_atts || v_json;
        c_cmkeys := c_cmkeys || CASE WHEN p_cmids[i] = '' THEN '' ELSE p_senders[i]::text || ':' || p_cmids[i] END;
        IF cardinality(v_atts) > 0 THEN
            v_claimed := v_claimed || v_atts;
            a_ids := a_ids || v_atts;
            a_msg := a_msg || array_fill(p_ids[i], ARRAY[cardinality(v_atts)]);
            a_pos := a_pos || ARRAY(SELECT generate_series(1, cardinality(v_atts)));
        END IF;
    END LOOP;
    IF cardinality(c_ord) = 0 THEN
        RETURN;
    END IF;
    -- The created messages, their attachment links, outbox rows and safety
    -- tasks: one multi-row statement each, in seq order.
    INSERT INTO messages (id, dialog_id, seq, sender_id, body, client_message_id, created_at)
        SELECT p_ids[o], p_dialog, v_first + k, p_senders[o], p_bodies[o], NULLIF(p_cmids[o], ''), v_now
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k) ORDER BY k;
    IF cardinality(a_ids) > 0 THEN
        UPDATE attachments a SET message_id = x.m, position = x.p
            FROM unnest(a_ids, a_msg, a_pos) AS x(id, m, p) WHERE a.id = x.id;
    END IF;
    INSERT INTO outbox (event_id, channel, payload, entity_id, message_id)
        SELECT p_event_ids[o]::uuid, p_channel, '\x'::bytea, p_ids[o]::text, p_ids[o]
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k) WHERE p_event_ids[o] <> '' ORDER BY k;
    INSERT INTO stub_tasks (message_id)
        SELECT p_ids[o] FROM unnest(c_ord) AS x(o) WHERE p_safety[o] ON CONFLICT DO NOTHING;
    UPDATE dialogs SET last_seq = v_last WHERE id = p_dialog;
    RETURN QUERY SELECT o, 'created', 0, p_ids[o]::text, v_first + k, p_senders[o]::text, p_bodies[o], p_cmids[o],
            v_now, c_atts[k]
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k);
END
$$;
