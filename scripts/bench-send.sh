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
# PostgreSQL cluster (initdb in a temporary folder, a random password for
# every connection, scram-sha-256; fsync and
# synchronous_commit at their defaults, on — `-fsync off|both` turns fsync
# off with ALTER SYSTEM on this cluster only; it never touches a server it
# did not start), one redis-server, and one han-gateway per arm, each arm on
# a database of its own in that cluster:
#   gw-on    this tree's gateway, the send route's built-in rate-limit rules
#            kept but every limit raised (runtime settings,
#            rate_limit_policies) so nothing is denied;
#   gw-off   this tree's gateway, the send route's policy set to no rules [];
#   gw-p1    gw-on with GOMAXPROCS=1: the gateway runs Go code on one core
#            at a time and leaves the other to PostgreSQL, Redis and the
#            generator (a container with a one-CPU limit gets the same);
#   sql      `han-loadtest run send-sql`: store.SendMessage on a pgx pool
#            opened as the gateway opens its own (same pool size and exec
#            mode), no HTTP, no Redis;
#   sql-p1   sql with the same client at GOMAXPROCS=1;
#   gw-nl, sql-nl  gw-on and sql without the waits for company
#            (HAN_SEND_LINGER=0 and HAN_IDEMPOTENCY_LINGER=0; send-sql's
#            -send-linger 0): every transaction and pipeline leaves at once;
#   old-on, old-off  with -old: the same as gw-* built from <commit> (in a
#            temporary git worktree, its own migrations on its own database).
# Shapes: many dialogs (200 users in 20 dialogs) and hot dialog (-hot-dialog,
# 100 users in one dialog, 200 sender VUs: two per member). Every phase is
# `chat-fanout -send-only` (or send-sql) with -step-rates after an unmeasured
# -warmup at the first rate, each step -duration long: a step is held when
# ≥ 99 % of its offered sends were accepted (a 429 or 503 is a failure) and
# send p99 from the scheduled send time ≤ -step-p99; the phase's figure is
# its highest held step. Each of -reps rounds runs every arm once, the first
# arm rotating from round to round (A/B/A/B); the table shows medians.
# CPU: the generator samples user + sys from /proc at the start and end of
# each step (han-loadtest -cpu-pid), per process: the arm's gateway,
# PostgreSQL (the postmaster, every backend, and the reaped ones through the
# postmaster's cutime), redis-server, and the generator itself; the table
# shows CPU-ms per accepted send at the step -cpu-rate (the same offered rate
# for every arm; setup, warm-up and history read-back are outside it).
# After each phase its database is vacuumed and analyzed (outside every
# measured window), so no arm's autovacuum runs in another arm's phase.
# The cluster logs checkpoints, autovacuum runs and every statement slower
# than 100 ms; the table's header counts them, to tell PostgreSQL's own
# stalls from the machine's.
#
# Options: -fsync on|off|both (on), -old COMMIT, -duration (10s, per step),
# -warmup (5s), -rates-many (300,600,900,1200,1800), -rates-hot (same),
# -cpu-rate (300: a rate in both step lists), -arms-many (gw-on,gw-off,sql
# and old-on,old-off with -old), -arms-hot (gw-on,sql, and old-on with
# -old; "none" for either leaves that shape out), -step-p99 (100ms), -reps (3), -budget MINUTES (25: refuse a longer
# estimate), -exec-mode MODE (the gateways' HAN_DB_EXEC_MODE and send-sql's;
# default pgx's cache_statement), -pool N (pool_max_conns of the gateways of
# this tree and of send-sql; default the gateway's own, 20), -committers N
# (HAN_SEND_COMMITTERS of this tree's gateways and send-sql's
# -send-committers; default theirs), -pg-opts "-c k=v ..." (more settings for
# the cluster, e.g. -c shared_preload_libraries=pg_stat_statements), -keep (keep the work folder: each phase's
# summary and output, the servers' logs), -profile FILE (after the rounds, one
# more gw-on phase of the many-dialog shape at its median held rate, with a
# CPU profile of the gateway taken over that step into FILE and the
# generator's own profile of that whole phase into FILE.gen, and its top
# functions printed after the table). Output: a markdown table on stdout
# (logs on stderr), ready for docs/benchmarks.md.
set -euo pipefail

HAN_SCRIPT=bench-send.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

keep=0 fsync=on old="" duration=10s warmup=5s rates_many=300,600,900,1200,1800 rates_hot=300,600,900,1200,1800 cpu_rate=300
arms_many="" arms_hot="" profile="" step_p99=100ms reps=3 budget=25 exec_mode="" pg_opts="" pool="" committers=""
while [ $# -gt 0 ]; do
	case "$1" in
	-fsync) fsync=$2 ;;
	-old) old=$2 ;;
	-duration) duration=$2 ;;
	-rates-many) rates_many=$2 ;;
	-rates-hot) rates_hot=$2 ;;
	-warmup) warmup=$2 ;;
	-cpu-rate) cpu_rate=$2 ;;
	-arms-many) arms_many=$2 ;;
	-arms-hot) arms_hot=$2 ;;
	-profile) profile=$2 ;;
	-step-p99) step_p99=$2 ;;
	-reps) reps=$2 ;;
	-budget) budget=$2 ;;
	-exec-mode) exec_mode=$2 ;;
	-pg-opts) pg_opts=$2 ;;
	-pool) pool=$2 ;;
	-committers) committers=$2 ;;
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
[[ "$pool" =~ ^[0-9]*$ ]] || han_die "-pool: a number of connections"
[[ "$committers" =~ ^[0-9]*$ ]] || han_die "-committers: a number of transactions"
secs="${duration%s}"
[[ "$secs" =~ ^[0-9]+$ ]] || han_die "-duration: whole seconds like 5s"

wsecs="${warmup%s}"
[[ "$wsecs" =~ ^[0-9]+$ ]] || han_die "-warmup: whole seconds like 5s"
if [ -z "$arms_many" ]; then arms_many=gw-on,gw-off,sql && [ -n "$old" ] && arms_many+=,old-on,old-off; fi
if [ -z "$arms_hot" ]; then arms_hot=gw-on,sql && [ -n "$old" ] && arms_hot+=,old-on; fi
IFS=, read -r -a arms_m <<<"$arms_many"
IFS=, read -r -a arms_h <<<"$arms_hot"
# "none" leaves a shape out.
[ "$arms_many" = none ] && arms_m=()
[ "$arms_hot" = none ] && arms_h=()
for a in "${arms_m[@]}" "${arms_h[@]}"; do
	case "$a" in gw-on | gw-off | gw-p1 | gw-nl | sql | sql-p1 | sql-nl) ;; old-on | old-off) [ -n "$old" ] || han_die "arm $a needs -old" ;; *) han_die "unknown arm $a" ;; esac
done
for l in "$rates_many" "$rates_hot"; do
	case ",$l," in *",$cpu_rate,"*) ;; *) han_die "-cpu-rate $cpu_rate must be a step of -rates-many and -rates-hot" ;; esac
done
nsteps() { local IFS=,; set -- $1; echo $#; }
# A phase: warm-up, its steps, plus ≈ 10 s of setup and history read-back.
per_round=$((${#arms_m[@]} * ($(nsteps "$rates_many") * secs + wsecs + 10) + ${#arms_h[@]} * ($(nsteps "$rates_hot") * secs + wsecs + 10)))
est=$(((${#fsyncs[@]} * reps * per_round + 90) / 60))
han_log "estimate: ≤ $est min (${#fsyncs[@]} fsync setting(s) × $reps rounds × (${#arms_m[@]} + ${#arms_h[@]}) phases; steps stop at the first that does not hold)"
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
# 127.0.0.1 is open to every account on the machine, and the superuser can
# run programs on the server: every connection, over TCP and the socket (in
# $work/pg, mode 700), needs this run's random password. It reaches initdb
# in a file only the cluster's owner reads, never in its arguments, and the
# tools below in their environment (DATABASE_URL; psql's PGPASSWORD).
pg_pw="$(han_random_hex 32)"
mkdir -m 700 "$work/pg"
(umask 077 && printf '%s\n' "$pg_pw" >"$work/pg/initdb.pw")
[ "$(id -u)" -eq 0 ] && chown postgres "$work/pg" "$work/pg/initdb.pw"
as_pg "$PGBIN/initdb" -D "$work/pg/data" --auth=scram-sha-256 --pwfile="$work/pg/initdb.pw" -U postgres -E UTF8 --locale=C >"$work/initdb.log" 2>&1 ||
	han_die "initdb failed: $(tail -n 3 "$work/initdb.log")"
rm -f "$work/pg/initdb.pw"
pg_port="$(han_pick_port 0)"
as_pg "$PGBIN/pg_ctl" -D "$work/pg/data" -l "$work/pg/log" -w -t 60 \
	-o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=300 -c log_checkpoints=on -c log_autovacuum_min_duration=0 -c log_min_duration_statement=100 $pg_opts" start >/dev/null ||
	han_die "PostgreSQL did not start: $(tail -n 3 "$work/pg/log")"
pg_ctl_stop="as_pg '$PGBIN/pg_ctl' -D '$work/pg/data' -m fast -w stop"
postmaster="$(head -n 1 "$work/pg/data/postmaster.pid")"
# The password is hex: nothing in it needs escaping in a URL.
server="postgres://postgres:$pg_pw@127.0.0.1:$pg_port"
psql_() { han_psql "$PGBIN/psql" "$server/${1}?sslmode=disable" -X -qtA -v ON_ERROR_STOP=1 -c "$2"; }
for db in han_gw han_sql han_sql_p1 han_sql_nl han_old; do psql_ postgres "CREATE DATABASE $db" >/dev/null; done

# --- Redis ---------------------------------------------------------------------
export HAN_ENV=dev HAN_REDIS_API_PASSWORD="bench-$RANDOM$RANDOM$RANDOM"
export HAN_JWT_DEV_HS256_SECRET="bench-secret-$RANDOM$RANDOM-0123456789abcdef" HAN_HMAC_SECRET="bench-hmac-0123456789"
"$work/new/hanctl" redis acl --out "$work/users.acl" >/dev/null
# The script's own user on its own redis-server, for INFO commandstats.
bench_redis_pw="stats-$RANDOM$RANDOM$RANDOM"
echo "user bench_stats on >$bench_redis_pw -@all +info" >>"$work/users.acl"
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
# poolurl DB: dburl with -pool's pool_max_conns (the new tree's arms; the
# -old arm keeps its own default, as it was shipped).
poolurl() { echo "$(dburl "$1")${pool:+&pool_max_conns=$pool}"; }
DATABASE_URL="$(dburl han_gw)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_sql)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_sql_p1)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_sql_nl)" "$work/new/hanctl" migrate >/dev/null
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
declare -A arm_redis=([gw-on]=0 [gw-off]=2 [old-on]=4 [old-off]=6 [gw-p1]=8 [gw-nl]=10)
start_gateway() { # ARM BIN DB
	local arm=$1 bin=$2 db=$3 port
	port="$(han_pick_port 0)"
	# Each arm has Redis databases of its own (gw-on 0/1, gw-off 2/3, gw-p1 8/9, gw-nl 10/11, old-on
	# 4/5, old-off 6/7): the runtime-settings snapshot in the realtime
	# database is keyed by its version alone, and the arms' PostgreSQL
	# databases count their versions independently, so on shared databases
	# one arm would load another arm's rate-limit policy.
	local rdb="${arm_redis[$arm]}"
	local procs=()
	[ "$arm" = gw-p1 ] && procs=(GOMAXPROCS=1)
	[ "$arm" = gw-nl ] && procs=(HAN_SEND_LINGER=0 HAN_IDEMPOTENCY_LINGER=0)
	# The URLs (passwords) are set before env, so they are in its environment, not its arguments.
	DATABASE_URL="$(if [ "$bin" = "$work/new/han-gateway" ]; then poolurl "$db"; else dburl "$db"; fi)" REDIS_URL="$(redis_url "$rdb")" REDIS_REALTIME_URL="$(redis_url $((rdb + 1)))" \
		env "${procs[@]+"${procs[@]}"}" HAN_HTTP_ADDR="127.0.0.1:$port" HAN_INSTANCE_ID="bench-$arm" HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=0 HAN_DEBUG_ENDPOINTS="${debug_endpoints:-0}" \
		HAN_DB_EXEC_MODE="$exec_mode" HAN_SEND_COMMITTERS="$committers" "$bin" -migrate=false </dev/null >>"$work/$arm.log" 2>&1 &
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
# han_gw_off, gw-p1 han_gw_p1, gw-nl han_gw_nl, old-on han_old, old-off
# han_old_off, sql han_sql, sql-p1 han_sql_p1, sql-nl han_sql_nl (and no arm writes into another's tables, whose
# bloat and autovacuum would then be charged to the next arm).
for db in han_gw_off han_gw_p1 han_gw_nl han_old_off; do psql_ postgres "CREATE DATABASE $db" >/dev/null; done
DATABASE_URL="$(dburl han_gw_off)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_gw_p1)" "$work/new/hanctl" migrate >/dev/null
DATABASE_URL="$(dburl han_gw_nl)" "$work/new/hanctl" migrate >/dev/null
policy han_gw "$raised"
policy han_gw_p1 "$raised"
policy han_gw_nl "$raised"
policy han_gw_off '[]'
if [ -n "$old" ]; then
	DATABASE_URL="$(dburl han_old_off)" "$work/old/hanctl" migrate >/dev/null
	policy han_old "$raised"
	policy han_old_off '[]'
fi
declare -A arm_bin=([gw-on]="$work/new/han-gateway" [gw-p1]="$work/new/han-gateway" [gw-nl]="$work/new/han-gateway" [gw-off]="$work/new/han-gateway" [old-on]="$work/old/han-gateway" [old-off]="$work/old/han-gateway")
declare -A arm_db=([gw-on]=han_gw [gw-p1]=han_gw_p1 [gw-nl]=han_gw_nl [gw-off]=han_gw_off [old-on]=han_old [old-off]=han_old_off)
# stop_gateway ARM: SIGTERM (HAN_DRAIN_DELAY=0) and wait for the exit.
stop_gateway() {
	local p="${gw_pid[$1]}"
	kill "$p" 2>/dev/null || true
	for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
	kill -9 "$p" 2>/dev/null || true
}

# --- measuring -------------------------------------------------------------------
# cmdstats: Redis's per-command counters and event-loop reads
# (han_redis_cmdstats); a phase's delta (kept with -keep) shows what a send
# asks of Redis.
cmdstats() { han_redis_cmdstats "$redis_port" "$bench_redis_pw"; }
results="$work/results.tsv" # fsync shape arm round held gw pg redis gen load0 load1 redis-calls
: >"$results"
phase() { # FSYNC SHAPE ARM ROUND
	local fs=$1 shape=$2 arm=$3 round=$4 args=() sum="$work/$1-$2-$3-$4.json" rc=0
	if [ "$shape" = many ]; then
		args=(-users 200 -dialogs 20 -senders 32 -step-rates "$rates_many")
	else
		args=(-users 100 -hot-dialog -senders 200 -step-rates "$rates_hot")
	fi
	args+=(-step-p99 "$step_p99" -duration "$duration" -warmup "$warmup" -max-duration "$((secs * 8 + wsecs + 120))s" -quiet -summary-export "$sum")
	args+=(-cpu-pid "postgres=$postmaster+" -cpu-pid "redis=$redis_pid")
	local lt_env=() lt_db=""
	[ "$arm" = sql-p1 ] && lt_env=(GOMAXPROCS=1)
	if [ "${arm%-*}" = sql ]; then
		local nl=()
		[ "$arm" = sql-nl ] && nl=(-send-linger 0)
		# send-sql reads DATABASE_URL: the password stays out of its arguments.
		lt_db="$(poolurl "han_${arm//-/_}")"
		args=(send-sql -exec-mode "$exec_mode" ${committers:+-send-committers "$committers"} "${nl[@]+"${nl[@]}"}" "${args[@]}")
	else
		# A fresh gateway per phase, so no idle gateway of another arm adds
		# its background work to PostgreSQL's and Redis's CPU.
		start_gateway "$arm" "${arm_bin[$arm]}" "${arm_db[$arm]}"
		args=(chat-fanout -send-only -target "${gw_url[$arm]}" -cpu-pid "gateway=${gw_pid[$arm]}" "${args[@]}")
	fi
	local l0 l1 st0 st1 t0 t1
	cmdstats >"$work/$fs-$shape-$arm-$round.cmdstats0"
	l0="$(cut -d' ' -f1 /proc/loadavg)"
	read -r st0 t0 < <(han_steal_ticks)
	DATABASE_URL="$lt_db" env "${lt_env[@]+"${lt_env[@]}"}" "$LT" run "${args[@]}" -threshold 'history_missing==0' -threshold 'history_duplicates==0' \
		-threshold 'history_reordered==0' >"$work/$fs-$shape-$arm-$round.out" 2>&1 || rc=$?
	l1="$(cut -d' ' -f1 /proc/loadavg)"
	cmdstats >"$work/$fs-$shape-$arm-$round.cmdstats1"
	read -r st1 t1 < <(han_steal_ticks)
	l1="$l1 (steal $(han_steal_pct "$st0" "$t0" "$st1" "$t1") %)"
	# Sends per send transaction over the phase (set-up and warm-up included).
	local spt=""
	if [ "${arm%-*}" = sql ]; then
		spt="$(jq -r '.info.send_stats // empty' "$sum" 2>/dev/null || true)"
	elif [ "${arm#old}" = "$arm" ]; then
		spt="$(curl -fsS "${gw_url[$arm]}/metrics" 2>/dev/null | awk '$1 == "han_send_transactions_total" { t = $2 } $1 == "han_send_messages_total" { m = $2 } $1 == "han_send_batches_total" { b = $2 }
			END { if (t > 0) printf "%d sends in %d transactions (%.2f per transaction, %.2f dialogs)", m, t, m / t, b / t }')"
	fi
	[ "${arm%-*}" = sql ] || stop_gateway "$arm"
	# The phase's rows leave its tables due for autovacuum, which would then
	# run (and be charged to PostgreSQL's CPU) in whichever arm's phase comes
	# next: vacuum them now, outside every measured window.
	local db="${arm_db[$arm]:-han_${arm//-/_}}"
	psql_ "$db" "VACUUM ANALYZE" >/dev/null || han_log "VACUUM ANALYZE of $db failed"
	[ -s "$sum" ] || han_die "$arm $shape: no summary: $(tail -n 5 "$work/$fs-$shape-$arm-$round.out")"
	[ "$rc" = 0 ] || han_log "$arm $shape round $round: exit $rc (history check or run failed): $(grep -E '✗|error' "$work/$fs-$shape-$arm-$round.out" | head -n 3 | tr '\n' ' ')"
	local held cpu
	held="$(jq -r '.metrics.max_send_rate.values.value // 0' "$sum")"
	# CPU-ms per send at -cpu-rate; -1 where the arm did not reach that step.
	cpu="$(jq -r --arg k "cpu_$cpu_rate" '.info[$k] as $c | [($c.gateway // -1), ($c.postgres // -1), ($c.redis // -1), ($c.generator // -1)] | map(tostring) | join("\t")' "$sum")"
	# Redis commands per accepted send over the whole phase (set-up and
	# warm-up included; commands a script calls are counted too, as Redis
	# 7 does), and the script calls among them.
	local sends rcalls
	sends="$(jq -r '.metrics.sends_ok.values.count // 0' "$sum")"
	rcalls="$(awk -v n="$sends" 'FNR == NR { b[$1] = $2; next }
			$1 == "_reads" { r = $2 - b[$1]; next }
			$1 !~ /^(auth|hello|select|client\|.*|info|ping)$/ { c += $2 - b[$1] }
			$1 ~ /^(evalsha|eval|fcall)$/ { e += $2 - b[$1] }
			END { if (n > 0) printf "%.1f (%.1f; reads %.2f)", c / n, e / n, r / n; else printf "—" }' \
		"$work/$fs-$shape-$arm-$round.cmdstats0" "$work/$fs-$shape-$arm-$round.cmdstats1")"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$fs" "$shape" "$arm" "$round" "${held%.*}" "$cpu" "$l0" "$l1" "$rcalls" >>"$results"
	han_log "fsync $fs $shape $arm round $round: held ${held%.*}/s, CPU-ms/send at $cpu_rate/s (gw pg redis gen): $(echo "$cpu" | tr '\t' ' '), Redis commands (scripts) per send: $rcalls, load $l0→$l1${spt:+, $spt}"
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
			if [ "$shape" = many ]; then arms=("${arms_m[@]}"); else arms=("${arms_h[@]}"); fi
			n=${#arms[@]}
			[ "$n" -gt 0 ] || continue
			for k in $(seq 0 $((n - 1))); do
				phase "$fs" "$shape" "${arms[$(((k + round - 1) % n))]}" "$round"
			done
		done
	done
done

# --- the profile -------------------------------------------------------------------
if [ -n "$profile" ]; then
	rate="$(awk -F'\t' '$2 == "many" && $3 == "gw-on" { print $5 }' "$results" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')"
	[ -n "$rate" ] && [ "$rate" -gt 0 ] || rate="${rates_many%%,*}"
	debug_endpoints=1 start_gateway gw-on "$work/new/han-gateway" han_gw
	psecs=$((secs > 4 ? secs - 2 : secs))
	(sleep $((wsecs + 1)) && curl -fsS "${gw_url[gw-on]}/debug/pprof/profile?seconds=$psecs" -o "$profile") &
	prof_pid=$!
	"$LT" run chat-fanout -send-only -target "${gw_url[gw-on]}" -users 200 -dialogs 20 -senders 32 -step-rates "$rate" \
		-duration "$duration" -warmup "$warmup" -cpu-pid "gateway=${gw_pid[gw-on]}" -quiet -reconcile=false \
		-cpuprofile "$profile.gen" >"$work/profile.out" 2>&1 || true
	wait "$prof_pid" || han_log "the profile request failed"
	stop_gateway gw-on
fi

# --- the table -------------------------------------------------------------------
gw_pool="$(jq -r '.info.pool_max_conns // empty' "$work"/*-sql-1.json 2>/dev/null | head -n 1 || true)"
gw_committers="$(jq -r '.info.send_committers // empty' "$work"/*-sql-1.json 2>/dev/null | head -n 1 || true)"
mode="${exec_mode:-cache_statement (pgx default)}"
echo
slow="$(grep -c 'duration: ' "$work/pg/log" || true)"
ckpt="$(grep -c 'checkpoint complete' "$work/pg/log" || true)"
avac="$(grep -c 'automatic vacuum\|automatic analyze' "$work/pg/log" || true)"
echo "Send path, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, median of $reps rounds (A/B interleaved), $warmup warm-up then steps of $duration, held = ≥ 99 % accepted and p99 ≤ $step_p99."
for l in "${settings_lines[@]}"; do echo "PostgreSQL $l."; done
echo "Pools: gateway and send-sql ${gw_pool:-20} connections ($([ -n "$pool" ] && echo "-pool; the old arm its default" || echo "DATABASE_URL default")), send transactions at once ${gw_committers:-${committers:-default}} (HAN_SEND_COMMITTERS), HAN_DB_EXEC_MODE $mode; -old: ${old:-none}."
echo "PostgreSQL's log over the whole run: $slow statements slower than 100 ms, $ckpt checkpoints, $avac autovacuum/analyze runs."
echo
echo "| fsync | shape | arm | highest held sends/s (median; rounds) | CPU-ms per send at $cpu_rate/s: gateway | postgres | redis | generator | servers (gw+pg+redis) | Redis commands (scripts) per send | load avg |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '
function median(s,   a, n, t, i, j, m, b) { n = split(s, a, " "); m = 0
	for (i = 1; i <= n; i++) if (a[i] + 0 >= 0) b[++m] = a[i] + 0
	if (m == 0) return -1
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
	return b[int((m + 1) / 2)] }
function fmt(v) { return v < 0 ? "—" : sprintf("%.3f", v) }
{ k = $1 SUBSEP $2 SUBSEP $3; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
  held[k] = held[k] " " $5; gw[k] = gw[k] " " $6; pg[k] = pg[k] " " $7; rd[k] = rd[k] " " $8; ge[k] = ge[k] " " $9
  tot[k] = tot[k] " " ($7 < 0 ? -1 : ($6 < 0 ? 0 : $6) + $7 + ($8 < 0 ? 0 : $8)); ld[k] = ld[k] " " $10 "→" $11; if (!(k in rc)) rc[k] = $12 }
END { for (i = 1; i <= nk; i++) { k = order[i]; split(k, p, SUBSEP)
	printf "| %s | %s | %s | **%s** (%s) | %s | %s | %s | %s | %s | %s | %s |\n", p[1], (p[2] == "many" ? "200 users / 20 dialogs" : "hot: 100 users / 1 dialog"), p[3],
		((p[2] == "many" ? topm : toph) + 0 > 0 && median(held[k]) == (p[2] == "many" ? topm : toph) ? "≥ " : "") median(held[k]), substr(held[k], 2), (p[3] ~ /^sql/ ? "—" : fmt(median(gw[k]))), fmt(median(pg[k])), fmt(median(rd[k])), fmt(median(ge[k])), fmt(median(tot[k])), rc[k], substr(ld[k], 2) } }' topm="${rates_many##*,}" toph="${rates_hot##*,}" "$results"
echo
echo "\"≥ N\": the arm held the last step of its list, so its own limit is higher: add higher rates to find it."
if [ -n "$profile" ] && [ -s "$profile" ]; then
	echo
	echo "Gateway CPU profile (gw-on, many dialogs, ${rate}/s; $(grep -o 'step_[0-9]*[.]*: .*' "$work/profile.out" | head -n 1 | sed 's/^step_[0-9]*[.]*: //')):"
	echo
	echo '```'
	go tool pprof -top -cum -nodecount=40 "$work/new/han-gateway" "$profile" 2>/dev/null | sed -n '1,48p'
	echo '```'
fi
