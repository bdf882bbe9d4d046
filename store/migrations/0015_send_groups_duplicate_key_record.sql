-- send_groups records the Idempotency-Key of a send answered with the
-- message its clientMessageId repeats. Before, that answer wrote no
-- idempotency record: the key lived in Redis alone, and once Redis lost it
-- (eviction, FLUSHDB, a restart without persistence) the key was unknown
-- everywhere, so the key reused for another request wrote a second message
-- instead of being refused, and a retry of the key's own request was then
-- refused instead of replayed. Now the key's record names the repeated
-- message (its id and seq), written as a created send's is: an expired
-- record with the key is replaced, a live one answers idem_exists (the
-- caller answers from that record, as for a created send). The rest of the
-- function is unchanged (migrations 0009 and 0013 explain it).
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
    v_now timestamptz := now();
    v_canon int[] := '{}';
    v_member boolean[];
    v_ok int[];
    v_lock uuid[] := '{}';
    v_locked uuid[];
    v_locked_last bigint[];
    v_last bigint[];
    v_off int := 0;
    v_atts uuid[];
    v_cnt int;
    v_json text;
    v_ref int;
    v_dup_id uuid;
    v_dup_seq bigint;
    v_key text;
    v_claimed uuid[] := '{}';
    v_keys text[] := '{}';
    c_ord int[] := '{}';
    c_seq bigint[] := '{}';
    c_atts text[] := '{}';
    c_cmkeys text[] := '{}';
    a_ids uuid[] := '{}';
    a_msg uuid[] := '{}';
    a_pos int[] := '{}';
    g int;
    i int;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    FOR g IN 1 .. nd LOOP
        v_canon := v_canon || array_position(p_dialogs, p_dialogs[g]);
    END LOOP;
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
    END IF;
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
        v_atts := p_att_ids[v_off + 1 : v_off + p_att_counts[i]];
        v_off := v_off + p_att_counts[i];
        IF v_last[g] IS NULL OR NOT v_member[i] THEN
            RETURN QUERY SELECT i, 'not_member', 0, '', 0::bigint, '', '', '', v_now, '[]';
            CONTINUE;
        END IF;
        v_key := '';
        v_dup_id := NULL;
        v_dup_seq := NULL;
        v_ref := NULL;
        IF p_cmids[i] <> '' THEN
            v_key := g::text || ':' || p_senders[i]::text || ':' || p_cmids[i];
            -- The message the clientMessageId repeats, if any: one of this
            -- call's (v_ref) or a stored one.
            v_ref := array_position(c_cmkeys, v_key);
            IF v_ref IS NOT NULL THEN
                v_dup_id := p_ids[c_ord[v_ref]];
                v_dup_seq := c_seq[v_ref];
            ELSE
                SELECT m.id, m.seq INTO v_dup_id, v_dup_seq FROM messages m
                    WHERE m.dialog_id = p_dialogs[g] AND m.sender_id = p_senders[i] AND m.client_message_id = p_cmids[i];
            END IF;
        END IF;
        v_json := '[]';
        IF v_dup_id IS NULL AND cardinality(v_atts) > 0 THEN
            -- The rows are locked so that a concurrent delete either waits
            -- for this transaction or, committed first, leaves the row out.
            SELECT count(DISTINCT l.id), COALESCE(jsonb_agg(jsonb_build_object('id', l.id::text, 'filename', l.filename,
                    'contentType', l.content_type, 'sizeBytes', l.size_bytes) ORDER BY l.ord), '[]'::jsonb)::text
                INTO v_cnt, v_json
                FROM (SELECT a.id, a.filename, a.content_type, a.size_bytes, x.ord
                    FROM unnest(v_atts) WITH ORDINALITY AS x(id, ord) JOIN attachments a ON a.id = x.id
                    WHERE a.dialog_id = p_dialogs[g] AND a.uploader_id = p_senders[i] AND a.status = 'uploaded'
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
            v_keys := v_keys || (p_idem_scopes[i] || ':' || p_senders[i]::text || ':' || p_idem_keys[i]);
        END IF;
        IF v_ref IS NOT NULL THEN
            RETURN QUERY SELECT i, 'duplicate', c_ord[v_ref], '', 0::bigint, '', '', '', v_now, '[]';
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
        c_ord := c_ord || i;
        c_seq := c_seq || v_last[g];
        c_atts := c_atts || v_json;
        c_cmkeys := c_cmkeys || v_key;
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
    -- The created messages of every dialog, their attachment links, outbox
    -- rows and safety tasks: one multi-row statement each, in array order.
    INSERT INTO messages (id, dialog_id, seq, sender_id, body, client_message_id, created_at)
        SELECT p_ids[o], p_dialogs[p_msg_dialogs[o]], c_seq[k], p_senders[o], p_bodies[o], NULLIF(p_cmids[o], ''), v_now
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k) ORDER BY k;
    IF cardinality(a_ids) > 0 THEN
        UPDATE attachments a SET message_id = x.m, position = x.p
            FROM unnest(a_ids, a_msg, a_pos) AS x(id, m, p) WHERE a.id = x.id;
    END IF;
    INSERT INTO outbox (event_id, channel, payload, entity_id, message_id)
        SELECT p_event_ids[o]::uuid, p_channels[p_msg_dialogs[o]], '\x'::bytea, p_ids[o]::text, p_ids[o]
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k) WHERE p_event_ids[o] <> '' ORDER BY k;
    IF true = ANY(p_safety) THEN
        INSERT INTO stub_tasks (message_id)
            SELECT p_ids[o] FROM unnest(c_ord) AS x(o) WHERE p_safety[o] ON CONFLICT DO NOTHING;
    END IF;
    -- Under the row locks last_seq is still what was read: only the dialogs
    -- that got messages change.
    UPDATE dialogs d SET last_seq = x.l
        FROM unnest(p_dialogs, v_last) AS x(id, l) WHERE d.id = x.id AND x.l > d.last_seq;
    RETURN QUERY SELECT o, 'created', 0, p_ids[o]::text, c_seq[k], p_senders[o]::text, p_bodies[o], p_cmids[o],
            v_now, c_atts[k]
        FROM unnest(c_ord) WITH ORDINALITY AS x(o, k);
END
$$;
