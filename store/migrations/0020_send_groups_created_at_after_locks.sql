-- A message's created_at is the server's time of its write, never earlier
-- than the created_at of its dialog's previous message: within a dialog it
-- never goes down as seq goes up. Clients order dialogs by their last
-- message's createdAt and show history with its times.
--
-- Before, send_groups stamped every message with now(), the time its
-- transaction started, taken before the statement waited for the dialogs'
-- row locks. A group sending into two dialogs that waited for the first
-- one's lock took the second one's next seq after another instance's send
-- into it had committed, with an earlier time: in the dialog's history the
-- later message was older than the one before it (by as much as the lock
-- wait, 100 ms by default).
--
-- Now the time is clock_timestamp() taken once the row locks are held:
-- every message committed before in these dialogs was committed before
-- the locks were granted, so it was stamped earlier. Should the server's
-- clock step back (or a failover land on a server whose clock is behind),
-- the time is raised to the newest created_at of the locked dialogs' last
-- messages, found by one probe per dialog of the (dialog_id, seq) key at
-- the dialog's last_seq, usually on the leaf page the message insert
-- writes next.
-- That is one statement more inside the function and one index probe per
-- dialog of the call, nothing per message and no round trip. The
-- messages of one call still share one created_at.
--
-- Signature, outcomes and every other rule are unchanged (migrations 0009,
-- 0013, 0015 and 0016 explain them): an instance of the previous release
-- calls it as before. No table changes.
CREATE OR REPLACE FUNCTION send_groups(
    p_dialogs uuid[], p_channels text[], p_lock_timeout_ms bigint, p_msg_dialogs int[],
    p_ids uuid[], p_senders uuid[], p_bodies text[], p_cmids text[],
    p_att_counts int[], p_att_ids uuid[], p_event_ids text[], p_safety boolean[],
    p_idem_scopes text[], p_idem_keys text[], p_idem_fps text[], p_idem_status int[],
    p_idem_meta text[], p_idem_ttl_ms bigint[])
RETURNS TABLE (r_ord int, r_outcome text, r_ref int, r_id text, r_seq bigint, r_sender text, r_body text,
    r_cmid text, r_created_at timestamptz, r_attachments text)
LANGUAGE plpgsql AS $$
DECLARE
    n int := cardinality(p_ids);
    nd int := cardinality(p_dialogs);
    na int := cardinality(p_att_ids);
    -- The time the messages are written at, taken once the dialogs' row
    -- locks are held (see the top of this file).
    v_now timestamptz;
    v_prev_at timestamptz;
    v_canon int[] := '{}';
    v_member boolean[];
    v_ok int[];
    v_lock uuid[] := '{}'; -- the group's dialogs, at most a few dozen
    v_locked uuid[];
    v_locked_last bigint[];
    v_last bigint[];
    v_first int; -- message i's attachments are p_att_ids[v_first + 1 .. v_first + p_att_counts[i]]
    v_off int := 0;
    v_cnt int;
    v_json text;
    v_ref int;
    v_dup_id uuid;
    v_dup_seq bigint;
    v_taken boolean;
    v_atts uuid[];
    -- Per message: the first message of the call with its dialog, sender
    -- and clientMessageId (NULL without one), and the first with its
    -- idempotency key (NULL without one).
    v_cm_head int[];
    v_idem_head int[];
    -- Per first message: the first created message with its
    -- clientMessageId, and whether a message of the call recorded its key.
    v_cm_created int[];
    v_idem_used boolean[];
    -- Per message: its seq once created (NULL: not created) and its
    -- attachments' JSON.
    v_seq bigint[];
    v_json_of text[];
    v_created int := 0;
    -- Per attachment slot: the first slot naming the same attachment; per
    -- first slot, whether a created message claimed it; per slot, the
    -- created message linking it and its position there.
    v_att_head int[];
    v_att_claimed boolean[];
    v_att_msg int[];
    v_att_pos int[];
    g int;
    i int;
    j int;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    IF n = 0 THEN
        RETURN;
    END IF;
    FOR g IN 1 .. nd LOOP
        v_canon := v_canon || array_position(p_dialogs, p_dialogs[g]);
    END LOOP;
    IF n = 1 THEN
        -- A lone message is its own first (no query needed).
        v_cm_head := ARRAY[CASE WHEN p_cmids[1] <> '' THEN 1 END];
        v_idem_head := ARRAY[CASE WHEN p_idem_keys[1] <> '' THEN 1 END];
    ELSE
        SELECT array_agg(y.cm ORDER BY y.i), array_agg(y.ik ORDER BY y.i) INTO v_cm_head, v_idem_head
            FROM (SELECT x.i,
                    CASE WHEN x.c <> '' THEN min(x.i) OVER (PARTITION BY p_dialogs[x.g], x.s, x.c) END::int AS cm,
                    CASE WHEN x.k <> '' THEN min(x.i) OVER (PARTITION BY x.sc, x.s, x.k) END::int AS ik
                FROM unnest(p_msg_dialogs, p_senders, p_cmids, p_idem_scopes, p_idem_keys)
                    WITH ORDINALITY AS x(g, s, c, sc, k, i)) AS y;
    END IF;
    v_cm_created := array_fill(NULL::int, ARRAY[n]);
    v_idem_used := array_fill(false, ARRAY[n]);
    v_seq := array_fill(NULL::bigint, ARRAY[n]);
    v_json_of := array_fill(NULL::text, ARRAY[n]);
    IF na > 0 THEN
        SELECT array_agg(y.h ORDER BY y.j) INTO v_att_head
            FROM (SELECT x.j, min(x.j) OVER (PARTITION BY x.id)::int AS h FROM unnest(p_att_ids) WITH ORDINALITY AS x(id, j)) AS y;
        v_att_claimed := array_fill(false, ARRAY[na]);
        v_att_msg := array_fill(NULL::int, ARRAY[na]);
        v_att_pos := array_fill(NULL::int, ARRAY[na]);
    END IF;
    -- Which messages' senders are members of their dialogs, one read.
    SELECT array_agg(x.i) INTO v_ok
        FROM unnest(p_msg_dialogs, p_senders) WITH ORDINALITY AS x(g, s, i)
        WHERE EXISTS (SELECT 1 FROM dialog_members m WHERE m.dialog_id = p_dialogs[x.g] AND m.user_id = x.s);
    v_member := array_fill(false, ARRAY[n]);
    IF v_ok IS NOT NULL THEN
        FOREACH i IN ARRAY v_ok LOOP
            v_member[i] := true;
            IF NOT (p_dialogs[p_msg_dialogs[i]] = ANY (v_lock)) THEN
                v_lock := v_lock || p_dialogs[p_msg_dialogs[i]];
            END IF;
        END LOOP;
        -- The row locks of the dialogs with a member sending, in id order.
        SELECT array_agg(l.id), array_agg(l.last_seq) INTO v_locked, v_locked_last
            FROM (SELECT d.id, d.last_seq FROM dialogs d WHERE d.id = ANY (v_lock) ORDER BY d.id FOR NO KEY UPDATE) AS l;
        -- The newest created_at of the locked dialogs: their last messages,
        -- one probe each of messages' (dialog_id, seq) key. A statement of
        -- its own, so that its snapshot, taken after the locks, sees a
        -- message committed by a transaction the locks waited for.
        SELECT max(m.created_at) INTO v_prev_at
            FROM unnest(v_locked, v_locked_last) AS x(id, s) JOIN messages m ON m.dialog_id = x.id AND m.seq = x.s;
    END IF;
    -- GREATEST skips a NULL: no lock taken, or no message yet.
    v_now := GREATEST(clock_timestamp(), v_prev_at);
    v_last := array_fill(NULL::bigint, ARRAY[nd]);
    IF v_locked IS NOT NULL THEN
        FOR g IN 1 .. nd LOOP
            IF v_canon[g] = g THEN
                v_last[g] := v_locked_last[array_position(v_locked, p_dialogs[g])];
            END IF;
        END LOOP;
    END IF;
    FOR i IN 1 .. n LOOP
        g := v_canon[p_msg_dialogs[i]];
        v_first := v_off;
        v_off := v_off + p_att_counts[i];
        IF v_last[g] IS NULL OR NOT v_member[i] THEN
            RETURN QUERY SELECT i, 'not_member', 0, '', 0::bigint, '', '', '', v_now, '[]';
            CONTINUE;
        END IF;
        v_dup_id := NULL;
        v_dup_seq := NULL;
        v_ref := NULL;
        IF v_cm_head[i] IS NOT NULL THEN
            -- The message the clientMessageId repeats, if any: one of this
            -- call's (v_ref) or a stored one.
            v_ref := v_cm_created[v_cm_head[i]];
            IF v_ref IS NOT NULL THEN
                v_dup_id := p_ids[v_ref];
                v_dup_seq := v_seq[v_ref];
            ELSE
                SELECT m.id, m.seq INTO v_dup_id, v_dup_seq FROM messages m
                    WHERE m.dialog_id = p_dialogs[g] AND m.sender_id = p_senders[i] AND m.client_message_id = p_cmids[i];
            END IF;
        END IF;
        v_json := '[]';
        IF v_dup_id IS NULL AND p_att_counts[i] > 0 THEN
            -- An attachment a created message of this call links is taken.
            v_taken := false;
            v_atts := '{}';
            FOR j IN v_first + 1 .. v_off LOOP
                v_taken := v_taken OR v_att_claimed[v_att_head[j]];
                v_atts := v_atts || p_att_ids[j];
            END LOOP;
            IF v_taken THEN
                RETURN QUERY SELECT i, 'invalid_attachment', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
            -- The rows are locked so that a concurrent delete either waits
            -- for this transaction or, committed first, leaves the row out.
            SELECT count(DISTINCT l.id), COALESCE(jsonb_agg(jsonb_build_object('id', l.id::text, 'filename', l.filename,
                    'contentType', l.content_type, 'sizeBytes', l.size_bytes) ORDER BY l.ord), '[]'::jsonb)::text
                INTO v_cnt, v_json
                FROM (SELECT a.id, a.filename, a.content_type, a.size_bytes, x.ord
                    FROM unnest(v_atts) WITH ORDINALITY AS x(id, ord) JOIN attachments a ON a.id = x.id
                    WHERE a.dialog_id = p_dialogs[g] AND a.uploader_id = p_senders[i] AND a.status = 'uploaded'
                        AND a.message_id IS NULL
                    FOR NO KEY UPDATE OF a) AS l;
            IF v_cnt <> cardinality(v_atts) THEN
                RETURN QUERY SELECT i, 'invalid_attachment', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
        END IF;
        IF v_idem_head[i] IS NOT NULL THEN
            IF v_idem_used[v_idem_head[i]] THEN
                RETURN QUERY SELECT i, 'idem_exists', 0, '', 0::bigint, '', '', '', v_now, '[]';
                CONTINUE;
            END IF;
            -- As InsertIdempotencyTx: an expired record with the key is
            -- replaced, a live one refuses the message. The record names
            -- the message this send creates, or the one its
            -- clientMessageId repeats.
            INSERT INTO idempotency_records AS r
                (scope, user_id, key_hmac, fingerprint, status, resource_id, version, meta, created_at, expires_at)
                VALUES (p_idem_scopes[i], p_senders[i], p_idem_keys[i], p_idem_fps[i], p_idem_status[i],
                    CASE WHEN v_dup_id IS NULL THEN p_ids[i] ELSE v_dup_id END::text,
                    CASE WHEN v_dup_id IS NULL THEN v_last[g] + 1 ELSE v_dup_seq END, p_idem_meta[i]::jsonb,
                    v_now, v_now + p_idem_ttl_ms[i] * interval '1 millisecond')
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
            v_idem_used[v_idem_head[i]] := true;
        END IF;
        IF v_ref IS NOT NULL THEN
            RETURN QUERY SELECT i, 'duplicate', v_ref, '', 0::bigint, '', '', '', v_now, '[]';
            CONTINUE;
        ELSIF v_dup_id IS NOT NULL THEN
            RETURN QUERY SELECT i, 'duplicate', 0, m.id::text, m.seq, m.sender_id::text, m.body, m.client_message_id,
                m.created_at, COALESCE((SELECT jsonb_agg(jsonb_build_object('id', a.id::text, 'filename', a.filename,
                    'contentType', a.content_type, 'sizeBytes', a.size_bytes) ORDER BY a.position)
                    FROM attachments a WHERE a.message_id = m.id), '[]'::jsonb)::text
                FROM messages m WHERE m.id = v_dup_id;
            CONTINUE;
        END IF;
        v_last[g] := v_last[g] + 1;
        v_seq[i] := v_last[g];
        v_json_of[i] := v_json;
        v_created := v_created + 1;
        IF v_cm_head[i] IS NOT NULL THEN
            v_cm_created[v_cm_head[i]] := i;
        END IF;
        FOR j IN v_first + 1 .. v_off LOOP
            v_att_claimed[v_att_head[j]] := true;
            v_att_msg[j] := i;
            v_att_pos[j] := j - v_first;
        END LOOP;
    END LOOP;
    IF v_created = 0 THEN
        RETURN;
    END IF;
    -- The created messages of every dialog, their attachment links, outbox
    -- rows and safety tasks: one multi-row statement each, in array order.
    -- These statements read the message arrays side by side with unnest,
    -- not by subscript (see the top of this file).
    INSERT INTO messages (id, dialog_id, seq, sender_id, body, client_message_id, created_at)
        SELECT x.id, p_dialogs[x.g], x.s, x.sender, x.body, NULLIF(x.cmid, ''), v_now
        FROM unnest(v_seq, p_ids, p_msg_dialogs, p_senders, p_bodies, p_cmids) WITH ORDINALITY AS x(s, id, g, sender, body, cmid, o)
        WHERE x.s IS NOT NULL ORDER BY x.o;
    IF na > 0 THEN
        UPDATE attachments a SET message_id = p_ids[x.o], position = x.p
            FROM unnest(p_att_ids, v_att_msg, v_att_pos) AS x(id, o, p) WHERE x.o IS NOT NULL AND a.id = x.id;
    END IF;
    INSERT INTO outbox (event_id, channel, payload, entity_id, message_id)
        SELECT x.ev::uuid, p_channels[x.g], '\x'::bytea, x.id::text, x.id
        FROM unnest(v_seq, p_ids, p_msg_dialogs, p_event_ids) WITH ORDINALITY AS x(s, id, g, ev, o)
        WHERE x.s IS NOT NULL AND x.ev <> '' ORDER BY x.o;
    IF true = ANY(p_safety) THEN
        INSERT INTO stub_tasks (message_id)
            SELECT x.id FROM unnest(v_seq, p_ids, p_safety) AS x(s, id, safety) WHERE x.s IS NOT NULL AND x.safety
            ON CONFLICT DO NOTHING;
    END IF;
    -- Under the row locks last_seq is still what was read: only the dialogs
    -- that got messages change.
    UPDATE dialogs d SET last_seq = x.l
        FROM unnest(p_dialogs, v_last) AS x(id, l) WHERE d.id = x.id AND x.l > d.last_seq;
    RETURN QUERY SELECT x.o::int, 'created', 0, x.id::text, x.s, x.sender::text, x.body, x.cmid, v_now, x.atts
        FROM unnest(v_seq, p_ids, p_senders, p_bodies, p_cmids, v_json_of) WITH ORDINALITY AS x(s, id, sender, body, cmid, atts, o)
        WHERE x.s IS NOT NULL;
END
$$;
