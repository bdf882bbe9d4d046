#!/usr/bin/env bash
# scripts/bench-send.sh — the send path (POST /v1/dialogs/{id}/messages with
# an Idempotency-Key) through the gateway vs the same SQL alone, A/B
# interleaved, median of 3 (docs/benchmarks.md, "Send path").
#
#   scripts/bench-send.sh                    # fsync on, ≈ 8 min
#   scripts/bench-send.sh -fsync both        # the matrix with fsync on, then off
#   scripts/bench-send.sh -old <commit>      # + that commit's gateway as a third arm
#   scripts/bench-send.sh -duration 2s -rates-many 50,100 -rates-hot 50,100 -reps 1   # a quick try
#
# It starts its own servers, all on loopback, all stopped at the end: one
# PostgreSQL cluster (initdb in a temporary folder; fsync and
# synchronous_commit at their defaults, on — `-fsync off|both` turns fsync
# off with ALTER SYSTEM on this cluster only; it never touches a server it
# did not start), one redis-server, and one han-gateway per arm, each arm on
# a database of its own in that cluster:
#   gw-on    this tree's gateway, the send route's built-in rate-limit rules
#            kept but every limit raised (runtime settings,
#            rate_limit_policies) so nothing is denied;
#   gw-off   this tree's gateway, the send route's policy set to no rules [];
#   sql      `han-loadtest run send-sql`: store.SendMessage on a pgx pool
#            opened as the gateway opens its own (same pool size and exec
#            mode), no HTTP, no Redis;
#   old-on, old-off  with -old: the same as gw-* built from <commit> (in a
#            temporary git worktree, its own migrations on its own database).
# Shapes: many dialogs (200 users in 20 dialogs) and hot dialog (-hot-dialog,
# 100 users in one dialog, 200 sender VUs: two per member). Every phase is
# `chat-fanout -send-only` (or send-sql) with -step-rates, each step
# -duration long: a step is held when ≥ 99 % of its offered sends were
# accepted (a 429 or 503 is a failure) and send p99 from the scheduled send
# time ≤ -step-p99; the phase's figure is its highest held step. Each of 3
# rounds runs every arm once, the first arm rotating from round to round
# (A/B/A/B); the table shows medians.
# CPU: user + sys from /proc/<pid>/stat before and after each phase, per
# process: the arm's gateway, PostgreSQL (the postmaster, every backend,
# and the reaped ones through the postmaster's cutime), redis-server, and
# the generator (the shell's `times` around it); divided by the accepted
# sends (CPU-seconds per 1,000 sends; setup and history read-back
# included).
#
# Options: -fsync on|off|both (on), -old COMMIT, -duration (5s, per step),
# -rates-many (100,200,400,800), -rates-hot (100,200,400,800), -step-p99
# (100ms), -reps (3), -budget MINUTES (15: refuse a longer estimate),
# -exec-mode MODE (the gateways' HAN_DB_EXEC_MODE and send-sql's; default
# pgx's cache_statement), -keep (keep the work folder: each phase's summary
# and output, the servers' logs). Output: a markdown table on stdout (logs on
# stderr), ready for docs/benchmarks.md.
set -euo pipefail

HAN_SCRIPT=bench-send.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

keep=0 fsync=on old="" duration=5s rates_many=100,200,400,800 rates_hot=100,200,400,800 step_p99=100ms reps=3 budget=15 exec_mode=""
while [ $# -gt 0 ]; do
	case "$1" in
	-fsync) fsync=$2 ;;
	-old) old=$2 ;;
	-duration) duration=$2 ;;
	-rates-many) rates_many=$2 ;;
	-rates-hot) rates_hot=$2 ;;
	-step-p99) step_p99=$2 ;;
	-reps) reps=$2 ;;
	-budget) budget=$2 ;;
	-exec-mode) exec_mode=$2 ;;
	-keep) keep=1 && shift && continue ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) han_die "unknown argument $1 (try --help)" ;;
	esac
	shift 2 || han_die "$1 needs a value"
done
case "$fsync" in on) fsyncs=(on) ;; off) fsyncs=(off) ;; both) fsyncs=(on off) ;; *) han_die "-fsync on|off|both" ;; esac
secs="${duration%s}"
[[ "$secs" =~ ^[0-9]+$ ]] || han_die "-duration: whole seconds like 5s"

arms=(gw-on gw-off sql)
[ -n "$old" ] && arms+=(old-on old-off)
nsteps() { local IFS=,; set -- $1; echo $#; }
# A phase: its steps, plus ≈ 10 s of setup and history read-back.
per_round=$((($(nsteps "$rates_many") + $(nsteps "$rates_hot")) * secs + 20))
est=$(((${#fsyncs[@]} * reps * ${#arms[@]} * per_round + 90) / 60))
han_log "estimate: ≤ $est min (${#fsyncs[@]} fsync setting(s) × $reps rounds × ${#arms[@]} arms × 2 shapes; steps stop at the first that does not hold)"
[ "$est" -le "$budget" ] || han_die "estimate $est min is over -budget $budget: fewer -reps, steps or a shorter -duration"

han_ensure_packages --curl --jq
work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-send.XXXXXX")"
chmod 711 "$work"
pids=()
pg_ctl_stop=""
oldtree=""
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
	local p
	for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
	for _ in $(seq 1 100); do
		alive=0
		for p in "${pids[@]+"${pids[@]}"}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && break
		sleep 0.1
	done
	[ -n "$pg_ctl_stop" ] && eval "$pg_ctl_stop" >/dev/null 2>&1
	[ -n "$oldtree" ] && git worktree remove --force "$oldtree" >/dev/null 2>&1
	if [ "$keep" = 1 ]; then han_log "kept $work (summaries, logs)"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

han_log "building this tree's binaries"
go build -o "$work/new/" ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest || han_die "go build failed"
LT="$work/new/han-loadtest"
if [ -n "$old" ]; then
	oldtree="$work/oldtree"
	git worktree add --detach "$oldtree" "$old" >/dev/null 2>&1 || han_die "git worktree add $old failed"
	han_log "building $old's gateway in $oldtree"
	(cd "$oldtree" && go build -o "$work/old/" ./cmd/han-gateway ./cmd/hanctl) || han_die "go build of $old failed"
fi

# --- PostgreSQL: our own cluster ---------------------------------------------
PGBIN="$(han_pg_bindir)" || han_die "PostgreSQL binaries not found"
as_pg() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
mkdir -p "$work/pg"
[ "$(id -u)" -eq 0 ] && chown postgres "$work/pg"
as_pg "$PGBIN/initdb" -D "$work/pg/data" -A trust -U postgres -E UTF8 --locale=C >"$work/initdb.log" 2>&1 ||
	han_die "initdb failed: $(tail -n 3 "$work/initdb.log")"
pg_port="$(han_pick_port 0)"
as_pg "$PGBIN/pg_ctl" -D "$work/pg/data" -l "$work/pg/log" -w -t 60 \
	-o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null ||
	han_die "PostgreSQL did not start: $(tail -n 3 "$work/pg/log")"
pg_ctl_stop="as_pg '$PGBIN/pg_ctl' -D '$work/pg/data' -m fast -w stop"
postmaster="$(head -n 1 "$work/pg/data/postmaster.pid")"
server="postgres://postgres@127.0.0.1:$pg_port"
psql_() { "$PGBIN/psql" -X -qtA -v ON_ERROR_STOP=1 -d "$server/${1}?sslmode=disable" -c "$2"; }
for db in han_gw han_sql han_old; do psql_ postgres "CREATE DATABASE $db" >/dev/null; done

# --- Redis ---------------------------------------------------------------------
export HAN_ENV=dev HAN_REDIS_API_PASSWORD="bench-$RANDOM$RANDOM$RANDOM"
export HAN_JWT_DEV_HS256_SECRET="bench-secret-$RANDOM$RANDOM-0123456789abcdef" HAN_HMAC_SECRET="bench-hmac-0123456789"
"$work/new/hanctl" redis acl --out "$work/users.acl" >/dev/null
redis_port="$(han_pick_port 0)"
redis-server --port "$redis_port" --bind 127.0.0.1 --aclfile "$work/users.acl" --dir "$work" --save '' \
	--appendonly yes --appendfsync everysec --daemonize no --logfile "$work/redis.log" </dev/null >/dev/null 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
redis_url() { echo "redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/$1"; }
for _ in $(seq 1 50); do
	(exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
	sleep 0.1
done

# --- gateways: one per arm, each on its database ---------------------------------
dburl() { echo "$server/$1?sslmode=disable"; }
DATABASE_URL="$(dburl han_gw)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_sql)" "$work/new/hanctl" migrate >/dev/null
[ -n "$old" ] && DATABASE_URL="$(dburl han_old)" "$work/old/hanctl" migrate >/dev/null

# policy DB RULES: the send route's rules; GET history and setup routes raised
# so the read-back and setup are never denied (outside the measured sends).
policy() {
	psql_ "$1" "INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES
	  ('POST /v1/dialogs/{id}/messages', 'sliding', 'fail-closed', '$2'),
	  ('GET /v1/dialogs/{id}/messages', 'fixed', 'local', '[{\"family\":\"user\",\"limit\":1000000,\"windowMs\":60000}]')
	  ON CONFLICT (route) DO UPDATE SET algorithm = EXCLUDED.algorithm, on_failure = EXCLUDED.on_failure,
	  rules = EXCLUDED.rules, updated_at = now()" >/dev/null
}
raised='[{"family":"user","limit":100000000,"windowMs":10000},{"family":"ip","limit":100000000,"windowMs":10000},{"family":"dialog","limit":100000000,"windowMs":10000}]'

declare -A gw_pid gw_url
start_gateway() { # ARM BIN DB
	local arm=$1 bin=$2 db=$3 port
	port="$(han_pick_port 0)"
	env HAN_HTTP_ADDR="127.0.0.1:$port" DATABASE_URL="$(dburl "$db")" REDIS_URL="$(redis_url 0)" REDIS_REALTIME_URL="$(redis_url 1)" \
		HAN_INSTANCE_ID="bench-$arm" HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=0 HAN_SETTINGS_REFRESH_INTERVAL=1s \
		HAN_DB_EXEC_MODE="$exec_mode" "$bin" -migrate=false </dev/null >"$work/$arm.log" 2>&1 &
	gw_pid[$arm]=$!
	pids+=("$!")
	gw_url[$arm]="http://127.0.0.1:$port"
	for _ in $(seq 1 150); do
		curl -fsS "${gw_url[$arm]}/readyz" >/dev/null 2>&1 && return 0
		kill -0 "${gw_pid[$arm]}" 2>/dev/null || break
		sleep 0.2
	done
	han_die "$arm gateway did not become ready: $(tail -n 5 "$work/$arm.log")"
}
# The policy is per database, so each arm has its own: gw-on han_gw, gw-off
# han_gw_off, old-on han_old, old-off han_old_off, sql han_sql.
for db in han_gw_off han_old_off; do psql_ postgres "CREATE DATABASE $db" >/dev/null; done
DATABASE_URL="$(dburl han_gw_off)" "$work/new/hanctl" migrate >/dev/null
policy han_gw "$raised"
policy han_gw_off '[]'
start_gateway gw-on "$work/new/han-gateway" han_gw
start_gateway gw-off "$work/new/han-gateway" han_gw_off
if [ -n "$old" ]; then
	DATABASE_URL="$(dburl han_old_off)" "$work/old/hanctl" migrate >/dev/null
	policy han_old "$raised"
	policy han_old_off '[]'
	start_gateway old-on "$work/old/han-gateway" han_old
	start_gateway old-off "$work/old/han-gateway" han_old_off
fi
sleep 2 # the settings refresh (1 s) has reached every gateway

# --- measuring -------------------------------------------------------------------
hz="$(getconf CLK_TCK)"
ticks() { # PID...: utime + stime (+ cutime + cstime) in clock ticks
	local t=0 p
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13 + $14 + $15}')))
	done
	echo "$t"
}
pg_ticks() { ticks "$postmaster" $(pgrep -P "$postmaster" || true); }
# children_secs FILE: user + sys seconds of the shell's reaped children, from
# the output of `times` (run in this shell, not a subshell, which would
# report its own children).
children_secs() {
	tail -n 1 "$1" | awk '{ split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}

results="$work/results.tsv" # fsync shape arm round held sends gw pg redis gen load0 load1
: >"$results"
phase() { # FSYNC SHAPE ARM ROUND
	local fs=$1 shape=$2 arm=$3 round=$4 args=() gw="" sum="$work/$1-$2-$3-$4.json" rc=0
	if [ "$shape" = many ]; then
		args=(-users 200 -dialogs 20 -senders 32 -step-rates "$rates_many")
	else
		args=(-users 100 -hot-dialog -senders 200 -step-rates "$rates_hot")
	fi
	args+=(-step-p99 "$step_p99" -duration "$duration" -max-duration "$((secs * 8 + 120))s" -quiet -summary-export "$sum")
	if [ "$arm" = sql ]; then
		args=(send-sql -database-url "$(dburl han_sql)" -exec-mode "$exec_mode" "${args[@]}")
	else
		gw="${gw_pid[$arm]}"
		args=(chat-fanout -send-only -target "${gw_url[$arm]}" "${args[@]}")
	fi
	local l0 g0 p0 r0 c0 l1
	l0="$(cut -d' ' -f1 /proc/loadavg)"
	g0="$(ticks $gw)" p0="$(pg_ticks)" r0="$(ticks "$redis_pid")"
	times >"$work/times0"
	"$LT" run "${args[@]}" -threshold 'history_missing==0' -threshold 'history_duplicates==0' \
		-threshold 'history_reordered==0' >"$work/$fs-$shape-$arm-$round.out" 2>&1 || rc=$?
	times >"$work/times1"
	local dg dp dr dc
	dc="$(awk -v a="$(children_secs "$work/times1")" -v b="$(children_secs "$work/times0")" 'BEGIN { print a - b }')"
	dg=$(($(ticks $gw) - g0)) dp=$(($(pg_ticks) - p0)) dr=$(($(ticks "$redis_pid") - r0))
	l1="$(cut -d' ' -f1 /proc/loadavg)"
	[ -s "$sum" ] || han_die "$arm $shape: no summary: $(tail -n 5 "$work/$fs-$shape-$arm-$round.out")"
	[ "$rc" = 0 ] || han_log "$arm $shape round $round: exit $rc (history check or run failed): $(grep -E '✗|error' "$work/$fs-$shape-$arm-$round.out" | head -n 3 | tr '\n' ' ')"
	local held sends
	held="$(jq -r '.metrics.max_send_rate.values.value // 0' "$sum")"
	sends="$(jq -r '.metrics.sends_ok.values.count // 0' "$sum")"
	[ -z "$gw" ] && dg=-1
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$fs" "$shape" "$arm" "$round" "${held%.*}" "${sends%.*}" \
		"$dg" "$dp" "$dr" "$dc" "$l0" "$l1" >>"$results"
	han_log "fsync $fs $shape $arm round $round: held ${held%.*}/s, $sends sends, load $l0→$l1"
}

pg_settings() { psql_ postgres "SELECT current_setting('fsync') || ' / ' || current_setting('synchronous_commit') || ' / ' || current_setting('shared_buffers')"; }
settings_lines=()
for fs in "${fsyncs[@]}"; do
	psql_ postgres "ALTER SYSTEM SET fsync = $fs" >/dev/null
	psql_ postgres "SELECT pg_reload_conf()" >/dev/null
	sleep 1
	settings_lines+=("fsync $fs: fsync / synchronous_commit / shared_buffers = $(pg_settings)")
	for round in $(seq 1 "$reps"); do
		for shape in many hot; do
			n=${#arms[@]}
			for k in $(seq 0 $((n - 1))); do
				phase "$fs" "$shape" "${arms[$(((k + round - 1) % n))]}" "$round"
			done
		done
	done
done

# --- the table -------------------------------------------------------------------
gw_pool="$(jq -r '.info.pool_max_conns // empty' "$work"/*-sql-1.json 2>/dev/null | head -n 1)"
mode="${exec_mode:-cache_statement (pgx default)}"
echo
echo "Send path, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, median of $reps rounds (A/B interleaved), steps of $duration, held = ≥ 99 % accepted and p99 ≤ $step_p99."
for l in "${settings_lines[@]}"; do echo "PostgreSQL $l."; done
echo "Pools: gateway and send-sql ${gw_pool:-20} connections (DATABASE_URL default), HAN_DB_EXEC_MODE $mode; -old: ${old:-none}."
echo
echo "| fsync | shape | arm | highest held sends/s (median; rounds) | CPU-s per 1,000 sends: gateway | postgres | redis | generator | load avg |"
echo "|---|---|---|---|---|---|---|---|---|"
awk -F'\t' -v hz="$hz" '
function median(s,   a, n, t, i, j) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return a[int((n + 1) / 2)] }
{ k = $1 SUBSEP $2 SUBSEP $3; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
  held[k] = held[k] " " $5; n = ($6 > 0 ? $6 : 1)
  gw[k] = gw[k] " " ($7 < 0 ? -1 : $7 / hz / n * 1000); pg[k] = pg[k] " " $8 / hz / n * 1000
  rd[k] = rd[k] " " $9 / hz / n * 1000; ge[k] = ge[k] " " $10 / n * 1000; ld[k] = ld[k] " " $11 "→" $12 }
END { for (i = 1; i <= nk; i++) { k = order[i]; split(k, p, SUBSEP)
	g = median(gw[k]); gs = (g < 0 ? "—" : sprintf("%.3f", g))
	printf "| %s | %s | %s | **%s** (%s) | %s | %.3f | %.3f | %.3f | %s |\n", p[1], (p[2] == "many" ? "200 users / 20 dialogs" : "hot: 100 users / 1 dialog"), p[3],
		median(held[k]), substr(held[k], 2), gs, median(pg[k]), median(rd[k]), median(ge[k]), substr(ld[k], 2) } }' "$results"
