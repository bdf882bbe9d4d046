#!/usr/bin/env bash
# scripts/bench-send-groups.sh — the time of one send_groups call by the
# number of messages it carries: this tree's function against the one of an
# earlier migration, alternating, in one database (docs/benchmarks.md,
# "send_groups: cost per message").
#
#   go run ./internal/testenv/cmd/withpg -- scripts/bench-send-groups.sh
#
# Run it under withpg (HAN_TEST_DATABASE_URL: a private cluster). It creates
# a database, applies every migration of the tree, loads send_groups as
# defined by HAN_BENCH_OLD (default the 0015 migration) beside it under the
# name send_groups_old, and adds one user who is a member of 40 dialogs.
# Each call is one statement of nd dialogs × per messages, every message
# with a clientMessageId, an Idempotency-Key and an outbox event (100-byte
# bodies), in a transaction rolled back. It prints one line per call
# (function, round, dialogs, messages per dialog, messages created, ms as
# psql's \timing reports it, which includes building the arguments).
#
# Environment: HAN_BENCH_SIZES (default "1:256 2:256 32:16 4:256 8:256
# 16:256 32:256", dialogs:messages per dialog), HAN_BENCH_ROUNDS (3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
: "${HAN_TEST_DATABASE_URL:?run under go run ./internal/testenv/cmd/withpg --}"
old="${HAN_BENCH_OLD:-store/migrations/0015_send_groups_duplicate_key_record.sql}"
sizes="${HAN_BENCH_SIZES:-1:256 2:256 32:16 4:256 8:256 16:256 32:256}"
rounds="${HAN_BENCH_ROUNDS:-3}"

server="$HAN_TEST_DATABASE_URL"
db="bench_send_groups_$$"
# han_psql: the URL's password reaches psql in its environment, not its arguments.
han_psql psql "$server" -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >/dev/null
url="${server%/*}/$db"
for f in store/migrations/*.sql; do
	han_psql psql "$url" -X -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
done
sed 's/FUNCTION send_groups(/FUNCTION send_groups_old(/' "$old" | han_psql psql "$url" -X -q -v ON_ERROR_STOP=1 >/dev/null
han_psql psql "$url" -X -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
INSERT INTO users (id) VALUES ('10000000-0000-0000-0000-000000000001');
INSERT INTO dialogs (id, created_by) SELECT gen_random_uuid(), '10000000-0000-0000-0000-000000000001' FROM generate_series(1, 40);
INSERT INTO dialog_members (dialog_id, user_id) SELECT id, created_by FROM dialogs;
SQL

# One call of :nd dialogs × :per messages of the function :fn, rolled back.
call='\timing on
BEGIN;
WITH d AS (SELECT array_agg(id ORDER BY id) ds FROM (SELECT id FROM dialogs ORDER BY id LIMIT :nd) x),
 bot AS (SELECT created_by b FROM dialogs LIMIT 1),
 m AS (SELECT g, ((g-1) % :nd) + 1 AS di FROM generate_series(1, :nd * :per) g)
SELECT count(*) FILTER (WHERE r_outcome = '"'created'"') FROM d, bot, LATERAL (SELECT * FROM :fn(
  d.ds, (SELECT array_agg('"'ch'"'::text) FROM generate_series(1, :nd)), 1000,
  (SELECT array_agg(di ORDER BY g) FROM m),
  (SELECT array_agg(gen_random_uuid() ORDER BY g) FROM m),
  (SELECT array_agg(bot.b ORDER BY g) FROM m),
  (SELECT array_agg(repeat('"'x'"', 100) ORDER BY g) FROM m),
  (SELECT array_agg(('"'cmid-'"' || g)::text ORDER BY g) FROM m),
  (SELECT array_agg(0 ORDER BY g) FROM m),
  '"'{}'"'::uuid[],
  (SELECT array_agg(gen_random_uuid()::text ORDER BY g) FROM m),
  (SELECT array_agg(false ORDER BY g) FROM m),
  (SELECT array_agg('"'msg_send'"'::text ORDER BY g) FROM m),
  (SELECT array_agg(md5(random()::text) ORDER BY g) FROM m),
  (SELECT array_agg('"'fp'"'::text ORDER BY g) FROM m),
  (SELECT array_agg(201 ORDER BY g) FROM m),
  (SELECT array_agg('"'{}'"'::text ORDER BY g) FROM m),
  (SELECT array_agg(86400000::bigint ORDER BY g) FROM m))) r;
ROLLBACK;'

for r in $(seq "$rounds"); do
	for s in $sizes; do
		nd="${s%%:*}" per="${s##*:}"
		for fn in send_groups_old send_groups; do
			out="$(printf '%s\n' "$call" | han_psql psql "$url" -X -tA -v ON_ERROR_STOP=1 -v nd="$nd" -v per="$per" -v fn="$fn")"
			created="$(printf '%s\n' "$out" | grep -E '^[0-9]+$' | head -n 1)"
			ms="$(printf '%s\n' "$out" | grep '^Time:' | sed -n 2p | awk '{print $2}')"
			echo "$fn round=$r dialogs=$nd per=$per msgs=$((nd * per)) created=$created ms=$ms"
		done
	done
done
han_psql psql "$server" -X -q -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
