#!/usr/bin/env bash
# scripts/bench-centrifugo.sh — the gateway beside Centrifugo v6 on the same
# harness: one small fan-out comparison, runs interleaved, both results printed.
#
#   scripts/bench-centrifugo.sh              # 2 rounds × 2 servers of a 10 s broadcast, ≈ 1.5 min
#   scripts/bench-centrifugo.sh -reps 3 -conns 5000 -dialogs 500 -rate 3000
#   scripts/bench-centrifugo.sh -conns 5000 -dialogs 500 -steps 1000,2000,3000,4000,5000 -phase 6
#   scripts/bench-centrifugo.sh -scenario idle -conns 10000 -dialogs 1000   # connect rate, memory
#
# Centrifugo is a benchmark tool here, not a dependency of the product: it is
# installed with `GOBIN=<work folder>/bin go install
# github.com/centrifugal/centrifugo/v6@v6.9.1` into a temporary work folder
# (the Go build cache makes later installs quick), or taken from -centrifugo
# PATH (or HAN_CENTRIFUGO_BIN), which must be a Go build of v6.9.1.
#
# Each server runs on loopback with its own private redis-server, so each
# side's CPU is the server's plus its Redis's, and is started fresh for each
# run (its Redis stays):
#   gateway     a private PostgreSQL (withpg), migrated by hanctl; han-loadtest
#               PUBLISHes the gateway's event frames on the dialogs' channels of
#               Redis DB1;
#   Centrifugo  loadtest/centrifugo/config.json (Redis engine, HMAC JWT;
#               presence, history, recovery, join/leave off), port and Redis
#               address filled in per run; han-loadtest PUBLISHes Centrifugo's
#               publication messages on its engine's channels.
# han-loadtest broadcast drives both with the same shape, each for -phase
# seconds (gateway first in odd rounds, Centrifugo first in even ones), with
# the thresholds delivery_lost==0 and delivery_duplicates==0. Per run it
# prints deliveries/s, the delivery p99 from schedule, lost and duplicated
# deliveries, and the CPU-seconds per 1M deliveries of the server, its
# redis-server and the generator over the publish phase and drain alone
# (-cpu-pid), and the server's GC cycles per second over the whole run
# (go_gc_duration_seconds_count on its /metrics, before and after); then the
# medians of each side and gateway ÷ Centrifugo.
# With -steps R1,R2,… each run climbs those publish rates on the same
# connections (-phase seconds each) and stops at the first that misses
# p99 ≤ 100 ms from schedule or loses anything: per run the highest
# deliveries/s that held, then every step's line (rate, p99, loss, CPU).
# With -scenario idle it runs idle-connections instead: -conns connections
# opened -concurrency at a time, each subscribed to one of -dialogs dialogs,
# held -phase seconds; per run the connections opened per second and the
# server's heap + stack, RSS and goroutines per connection, read after a
# forced GC on both (the gateway's /debug/memstats, Centrifugo's pprof).
# Exit status: 0 every run passed its thresholds, 1 otherwise.
#
# Options: -scenario broadcast|idle (broadcast), -reps N (2), -conns N (200),
# -warmup SECONDS (3; -steps: unmeasured publishing at the first step's rate
# before the first step), -gen-profile (the generator's CPU profile of each run, <side>-<round>.gen.prof
# in the kept work folder), -profile SECONDS (a CPU profile of the gateway over SECONDS,
# gateway-<round>.prof in the kept work folder; broadcast: started -warmup + 1 s after all -conns
# sockets are open; idle: once 3 % of them are, in the connect phase), -dialogs N (20: the gateway needs 2..100 members per dialog), -rate N (400
# events/s), -payload N (128 bytes), -phase SECONDS (10), -concurrency N (200,
# idle), -steps LIST (broadcast), -centrifugo PATH, -cf-presence (Centrifugo's
# dialog namespace with presence on: each subscriber registered in Redis, as
# the gateway registers each connection), -cf-join-leave (and join/leave
# pushed to the channel's other subscribers, as the gateway tells a dialog's
# online members that a user came online), -gomaxprocs N (GOMAXPROCS=N for
# both servers: Go code of each on N cores at a time; default each its
# own: the machine's cores), -gw-env 'K=V …' (more environment for the
# gateway alone, e.g. 'GOGC=100' for its collector at Go's default), -keep (keep the work
# folder: summaries and logs). Bounded: each run by -max-duration (phase ×
# steps + 90 s + 1 s per 50 connections);
# everything it started is stopped on exit.
set -euo pipefail

HAN_SCRIPT=bench-centrifugo.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

CENTRIFUGO_MODULE=github.com/centrifugal/centrifugo/v6
CENTRIFUGO_VERSION=v6.9.1

if [ "${1:-}" != --inner ]; then
	steps="" scenario=broadcast reps=2 conns=200 dialogs=20 rate=400 payload=128 phase=10 concurrency=200 keep=0 gen_profile=0 warmup=3 profile=0 cf_presence=0 cf_join=0 procs="" gw_env=""
	cf_bin="${HAN_CENTRIFUGO_BIN:-}"
	while [ $# -gt 0 ]; do
		case "$1" in
		-scenario) scenario=$2 && shift ;;
		-reps) reps=$2 && shift ;;
		-conns) conns=$2 && shift ;;
		-dialogs) dialogs=$2 && shift ;;
		-rate) rate=$2 && shift ;;
		-payload) payload=$2 && shift ;;
		-phase) phase=$2 && shift ;;
		-concurrency) concurrency=$2 && shift ;;
		-steps) steps=$2 && shift ;;
		-warmup) warmup=$2 && shift ;;
		-centrifugo) cf_bin=$2 && shift ;;
		-gen-profile) gen_profile=1 keep=1 ;;
		-profile) profile=$2 keep=1 && shift ;;
		-keep) keep=1 ;;
		-cf-presence) cf_presence=1 ;;
		-cf-join-leave) cf_join=1 ;;
		-gomaxprocs) procs=$2 && shift ;;
		-gw-env) gw_env=$2 && shift ;;
		-h | --help)
			sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
			exit 0
			;;
		*) han_die "unknown argument $1 (try --help)" ;;
		esac
		shift
	done
	case "$scenario" in broadcast | idle) ;; *) han_die "-scenario $scenario: want broadcast or idle" ;; esac
	case "$steps" in *[!0-9,]*) han_die "-steps: want comma-separated rates, got '$steps'" ;; esac
	for v in "$reps" "$conns" "$dialogs" "$rate" "$payload" "$phase" "$concurrency" "$warmup" "$profile" "${procs:-0}"; do
		case "$v" in '' | *[!0-9]*) han_die "option values must be non-negative integers, got '$v'" ;; esac
	done
	han_ensure_packages --curl --jq
	work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-centrifugo.XXXXXX")"
	# shellcheck disable=SC2317 # the EXIT trap
	cleanup() {
		if [ "$keep" = 1 ]; then han_log "kept $work (summaries, logs)"; else rm -rf "$work"; fi
	}
	trap cleanup EXIT
	mkdir -p "$work/bin"
	if [ -z "$cf_bin" ]; then
		han_log "installing Centrifugo $CENTRIFUGO_VERSION into $work/bin (go install)"
		(cd "$work" && GOBIN="$work/bin" go install "$CENTRIFUGO_MODULE@$CENTRIFUGO_VERSION") ||
			han_die "go install $CENTRIFUGO_MODULE@$CENTRIFUGO_VERSION failed"
		cf_bin="$work/bin/centrifugo"
	fi
	[ -x "$cf_bin" ] || han_die "no Centrifugo binary at $cf_bin"
	# A go-installed binary reports "v0.0.0" itself (its version is set by
	# release builds); the module version recorded in the binary is the truth.
	cf_version="$(go version -m "$cf_bin" 2>/dev/null | awk -v m="$CENTRIFUGO_MODULE" '$1 == "mod" && $2 == m { print $3 }')"
	[ "$cf_version" = "$CENTRIFUGO_VERSION" ] || han_die "$cf_bin is ${cf_version:-not a Go build of $CENTRIFUGO_MODULE}, want $CENTRIFUGO_VERSION"
	cf_version="Centrifugo $cf_version"
	han_log "$cf_version ($cf_bin)"
	han_log "building han-gateway, hanctl, han-loadtest"
	go build -o "$work/bin/" ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest || han_die "go build failed"
	HAN_BC_WORK="$work" HAN_BC_CF="$cf_bin" HAN_BC_SHAPE="$scenario $reps $conns $dialogs $rate $payload $phase $concurrency $warmup" \
		HAN_BC_CF_VERSION="$cf_version" HAN_BC_STEPS="$steps" HAN_BC_GEN_PROFILE="$gen_profile" HAN_BC_PROFILE="$profile" HAN_BC_CF_PRESENCE="$cf_presence" HAN_BC_CF_JOIN="$cf_join" HAN_BC_PROCS="$procs" HAN_BC_GW_ENV="$gw_env" go run ./internal/testenv/cmd/withpg -- bash "$0" --inner
	exit $?
fi

# --- inner: a private PostgreSQL is up (HAN_TEST_DATABASE_URL) --------------------
work="$HAN_BC_WORK" cf_bin="$HAN_BC_CF"
read -r scenario reps conns dialogs rate payload phase concurrency warmup <<<"$HAN_BC_SHAPE"
steps="$HAN_BC_STEPS" gen_profile="${HAN_BC_GEN_PROFILE:-0}" profile="${HAN_BC_PROFILE:-0}"
servers=() redises=() # pids this script started and has not stopped
procs_env=()                  # -gomaxprocs: the environment of both servers
[ -n "${HAN_BC_PROCS:-}" ] && procs_env=(GOMAXPROCS="$HAN_BC_PROCS")
gw_env_vars=() # -gw-env: the gateway's extra environment, K=V words
[ -n "${HAN_BC_GW_ENV:-}" ] && read -r -a gw_env_vars <<<"$HAN_BC_GW_ENV"
# stop PID...: SIGTERM, up to 10 s to exit, then SIGKILL.
stop() {
	local p alive
	for p in "$@"; do kill "$p" 2>/dev/null || true; done
	for _ in $(seq 1 100); do
		alive=0
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && return 0
		sleep 0.1
	done
	for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
}
# shellcheck disable=SC2317 # the EXIT trap
cleanup_inner() { # the servers first, so they do not see their Redis vanish
	stop "${servers[@]+"${servers[@]}"}"
	stop "${redises[@]+"${redises[@]}"}"
}
trap cleanup_inner EXIT

wait_port() { # PORT: wait up to 10 s for a listener
	for _ in $(seq 1 100); do han_port_busy "$1" && return 0; sleep 0.1; done
	return 1
}
# launch_redis NAME [ARGS...]: a private redis-server on a free port, on a new
# one when another process took the port picked; sets redis_port, redis_pid.
launch_redis() {
	local name=$1 try
	shift
	for try in 1 2 3; do
		redis_port="$(han_pick_port 0)"
		redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work" --save '' --appendonly no --daemonize no \
			--logfile "$work/redis-$name.log" "$@" </dev/null >/dev/null 2>&1 &
		redis_pid=$!
		redises+=("$redis_pid")
		if wait_port "$redis_port" && sleep 0.2 && kill -0 "$redis_pid" 2>/dev/null; then
			return 0
		fi
		han_log "redis-server ($name) did not start on port $redis_port (try $try): $(tail -n 1 "$work/redis-$name.log" 2>/dev/null)"
	done
	return 1
}

# The gateway, on its own Redis (ACL as in production) and PostgreSQL.
export HAN_ENV=dev HAN_REDIS_API_PASSWORD="bc-$(han_random_hex 12)"
export HAN_JWT_DEV_HS256_SECRET="bc-$(han_random_hex 24)" HAN_HMAC_SECRET="bc-$(han_random_hex 12)"
"$work/bin/hanctl" redis acl --out "$work/users.acl" >/dev/null
# The script's own user on the gateway's redis-server, for INFO commandstats.
stats_pw="stats-$(han_random_hex 12)"
echo "user bench_stats on >$stats_pw -@all +info" >>"$work/users.acl"
launch_redis gateway --aclfile "$work/users.acl" || han_die "the gateway's redis-server did not start"
gw_redis_port=$redis_port gw_redis_pid=$redis_pid
export REDIS_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$gw_redis_port/0"
export REDIS_REALTIME_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$gw_redis_port/1"
DATABASE_URL="$HAN_TEST_DATABASE_URL" "$work/bin/hanctl" migrate >/dev/null || han_die "hanctl migrate failed"
# The private PostgreSQL's postmaster (its CPU, with its backends', is
# counted per connection in the idle scenario).
pg_port="$(sed -E 's#^[a-z]+://[^@]*@?[^:/]*:([0-9]+)/.*#\1#' <<<"$HAN_TEST_DATABASE_URL")"
pg_pid="$(ss -ltnpH "sport = :$pg_port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true)"
# cmdstats: the gateway's Redis per-command counters and event-loop reads
# (han_redis_cmdstats).
cmdstats() { han_redis_cmdstats "$gw_redis_port" "$stats_pw"; }
# ready PID URL: wait up to 30 s for URL to answer 2xx; fails early when PID
# exits (a port another process took meanwhile: the caller picks another).
ready() {
	for _ in $(seq 1 300); do
		curl -fsS "$2" >/dev/null 2>&1 && return 0
		kill -0 "$1" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
# start_gateway: a fresh gateway on a free port (sets gw_port, gw_pid), ready
# when it returns.
start_gateway() {
	local try
	for try in 1 2 3; do
		gw_port="$(han_pick_port 0)"
		# DATABASE_URL (its password) is set before env: its environment, not its arguments.
		DATABASE_URL="$HAN_TEST_DATABASE_URL" env "${procs_env[@]+"${procs_env[@]}"}" "${gw_env_vars[@]+"${gw_env_vars[@]}"}" HAN_HTTP_ADDR="127.0.0.1:$gw_port" HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=0 \
			HAN_DEBUG_ENDPOINTS=1 HAN_INSTANCE_ID=bench-gw "$work/bin/han-gateway" -migrate=false </dev/null >>"$work/gateway.log" 2>&1 &
		gw_pid=$!
		servers=("$gw_pid") # one server runs at a time
		ready "$gw_pid" "http://127.0.0.1:$gw_port/readyz" && return 0
		stop "$gw_pid" && servers=()
		han_log "the gateway did not start on port $gw_port (try $try)"
	done
	han_die "the gateway did not become ready: $(tail -n 5 "$work/gateway.log")"
}

# Centrifugo, on its own Redis, with the repository's configuration.
cf_secret="bc-$(han_random_hex 24)"
launch_redis centrifugo || han_die "Centrifugo's redis-server did not start"
cf_redis_port=$redis_port cf_redis_pid=$redis_pid
# start_centrifugo: a fresh Centrifugo on a free port (sets cf_port, cf_pid),
# ready when it returns.
start_centrifugo() {
	local try
	for try in 1 2 3; do
		cf_port="$(han_pick_port 0)"
		jq --argjson port "$cf_port" --arg redis "redis://127.0.0.1:$cf_redis_port" \
			--argjson presence "$( [ "${HAN_BC_CF_PRESENCE:-0}" = 1 ] && echo true || echo false)" \
			--argjson join "$( [ "${HAN_BC_CF_JOIN:-0}" = 1 ] && echo true || echo false)" \
			'.http_server.port = $port | .engine.redis.address = [$redis]
			| if $presence then .channel.namespaces[0].presence = true else . end
			| if $join then .channel.namespaces[0] += {join_leave: true, force_push_join_leave: true} else . end' \
			loadtest/centrifugo/config.json >"$work/centrifugo.json"
		env "${procs_env[@]+"${procs_env[@]}"}" CENTRIFUGO_CLIENT_TOKEN_HMAC_SECRET_KEY="$cf_secret" "$cf_bin" --config "$work/centrifugo.json" \
			</dev/null >>"$work/centrifugo.log" 2>&1 &
		cf_pid=$!
		servers=("$cf_pid")
		ready "$cf_pid" "http://127.0.0.1:$cf_port/health" && return 0
		stop "$cf_pid" && servers=()
		han_log "Centrifugo did not start on port $cf_port (try $try)"
	done
	han_die "Centrifugo did not become ready: $(tail -n 5 "$work/centrifugo.log")"
}

results="$work/results.tsv" # side, round, the figures, passed
: >"$results"
failed=0
LT="$work/bin/han-loadtest"
case "$scenario" in
broadcast)
	args=(broadcast -conns "$conns" -dialogs "$dialogs" -rate "$rate" -payload "$payload"
		-threshold 'delivery_lost==0' -threshold 'delivery_duplicates==0')
	what="broadcast, $conns connections over $dialogs dialogs, $rate events/s of $payload B for ${phase}s per run"
	names="deliveries/s|p99 ms|lost|duplicated|server CPU-s/1M|redis CPU-s/1M|server+redis CPU-s/1M|generator CPU-s/1M"
	figures='.metrics.delivery_rate.values.value, .metrics.delivery_latency.values["p(99)"],
		(.metrics.delivery_lost.values.count // 0), (.metrics.delivery_duplicates.values.count // 0),
		.info.target_cpu_s_per_1m_server, .info.target_cpu_s_per_1m_redis,
		(if .info.target_cpu_s_per_1m_server and .info.target_cpu_s_per_1m_redis
			then .info.target_cpu_s_per_1m_server + .info.target_cpu_s_per_1m_redis else null end),
		.info.target_cpu_s_per_1m_generator'
	if [ -n "$steps" ]; then
		# Step mode keeps each step's figures in its own line: the run's
		# delivery_* metrics stay empty, so no threshold on them.
		args=(broadcast -conns "$conns" -dialogs "$dialogs" -payload "$payload" -step-rates "$steps" -step-p99 100ms)
		[ "$warmup" -gt 0 ] && args+=(-warmup "${warmup}s")
		what="broadcast, $conns connections over $dialogs dialogs, $payload B events at $steps events/s for ${phase}s each (after ${warmup}s unmeasured at the first rate) while p99 ≤ 100 ms with none lost"
		names="max deliveries/s held"
		figures='.metrics.max_delivery_rate.values.value'
	fi
	;;
idle)
	args=(idle-connections -conns "$conns" -dialogs "$dialogs" -connect-concurrency "$concurrency")
	what="idle-connections, $conns connections ($concurrency at a time) each subscribed to one of $dialogs dialogs, held ${phase}s per run"
	names="connections/s|heap+stack KiB/conn|RSS KiB/conn|goroutines/conn|after a GC (1 yes)"
	figures='.metrics.connect_rate.values.value,
		(.metrics.server_mem_per_conn.values.value | if . then . / 1024 else null end),
		(.metrics.server_rss_per_conn.values.value | if . then . / 1024 else null end),
		.metrics.server_goroutines_per_conn.values.value, (if .info.gc_forced then 1 else 0 end),
		.info.connect_cpu_ms_per_conn_server, .info.connect_cpu_ms_per_conn_redis,
		(.info.connect_cpu_ms_per_conn_postgres // 0),
		((.info.connect_cpu_ms_per_conn_server // 0) + (.info.connect_cpu_ms_per_conn_redis // 0) + (.info.connect_cpu_ms_per_conn_postgres // 0)),
		.info.connect_cpu_ms_per_conn_generator'
	# CPU per connection over the connect phase alone (not the set-up of
	# users and dialogs, not the hold): the server, its redis-server, the
	# gateway's PostgreSQL (Centrifugo has none), the generator.
	names+="|server CPU-ms/conn|redis CPU-ms/conn|postgres CPU-ms/conn|servers CPU-ms/conn|generator CPU-ms/conn"
	;;
esac
# Every scenario's last figures: the server's GC cycles per second over the
# run, and the share of the machine's CPU time the hypervisor took (steal).
names+="|GC/s (whole run)|steal %"
nsteps=$(($(tr -cd , <<<"$steps" | wc -c) + 1))
args+=(-duration "${phase}s" -max-duration "$((phase * nsteps + warmup + 90 + conns / 50))s" -quiet)
# gc_count URL: the server's completed GC cycles (the Go collector's
# go_gc_duration_seconds_count on its Prometheus endpoint; both servers
# export it).
gc_count() { curl -fsS "$1/metrics" 2>/dev/null | awk '/^go_gc_duration_seconds_count/ { print $2; exit }'; }
# profile_gateway BASE FILE: broadcast: once the gateway holds every
# connection, wait out the warm-up; idle: once 3 % of the connections are
# open (the connect phase). Then a CPU profile of -profile seconds (bounded:
# gives up waiting after 2–4 minutes).
profile_gateway() {
	local base=$1 out=$2 i n want=$conns
	[ "$scenario" = idle ] && want=$((conns * 3 / 100))
	for i in $(seq 1 $((600 + conns / 10))); do
		n="$(curl -fsS "$base/metrics" 2>/dev/null | awk '/^han_ws_connections / { print int($2) }' || true)"
		[ "${n:-0}" -ge "$want" ] && break
		sleep 0.1
	done
	[ "$scenario" = broadcast ] && sleep "$((warmup + 1))"
	curl -fsS -o "$out" "$base/debug/pprof/profile?seconds=$profile" 2>/dev/null || han_log "no gateway profile: $out"
}
run_one() { # SIDE ROUND: on a fresh server, stopped after the run
	local side=$1 round=$2 sum="$work/$1-$2.json" rc=0 more=() base gc0 gc1 t0 t1 st0 tt0 st1 tt1
	read -r st0 tt0 < <(han_steal_ticks)
	[ "$gen_profile" = 1 ] && more+=(-cpuprofile "$work/$side-$round.gen.prof")
	case "$side" in
	gateway)
		start_gateway
		base="http://127.0.0.1:$gw_port"
		# broadcast: the publisher's Redis and the processes whose CPU is counted
		[ "$scenario" = broadcast ] &&
			more+=(-redis-url "$REDIS_REALTIME_URL" -cpu-pid "server=$gw_pid" -cpu-pid "redis=$gw_redis_pid")
		[ "$scenario" = idle ] &&
			more+=(-cpu-pid "server=$gw_pid" -cpu-pid "redis=$gw_redis_pid" ${pg_pid:+-cpu-pid "postgres=$pg_pid+"})
		gc0="$(gc_count "$base")" t0="$(date +%s.%N)"
		cmdstats >"$work/$side-$round.cmdstats0"
		local prof_pid=""
		if [ "$profile" -gt 0 ]; then
			profile_gateway "$base" "$work/$side-$round.prof" &
			prof_pid=$!
		fi
		"$LT" run "${args[@]}" -target "$base" "${more[@]+"${more[@]}"}" -summary-export "$sum" \
			>"$work/$side-$round.out" 2>&1 || rc=$?
		[ -n "$prof_pid" ] && { wait "$prof_pid" || true; }
		gc1="$(gc_count "$base")" t1="$(date +%s.%N)"
		cmdstats >"$work/$side-$round.cmdstats1"
		# What the run asked of Redis per connection (set-up included):
		# calls and µs of the costliest commands, and the event loop's reads.
		han_log "gateway round $round, Redis per connection (whole run): $(awk -v n="$conns" 'FNR == NR { c[$1] = $2; u[$1] = $3; next }
			{ dc = $2 - c[$1]; du = $3 - u[$1]; if (dc > 0) printf "%s %.2f calls %.1f µs\n", $1, dc / n, du / n }' \
			"$work/$side-$round.cmdstats0" "$work/$side-$round.cmdstats1" | sort -t' ' -k4 -rn | head -n 8 | paste -sd ';' -)"
		stop "$gw_pid" && servers=()
		;;
	centrifugo)
		start_centrifugo
		base="http://127.0.0.1:$cf_port"
		[ "$scenario" = broadcast ] &&
			more+=(-redis-url "redis://127.0.0.1:$cf_redis_port" -cpu-pid "server=$cf_pid" -cpu-pid "redis=$cf_redis_pid")
		[ "$scenario" = idle ] && more+=(-cpu-pid "server=$cf_pid" -cpu-pid "redis=$cf_redis_pid")
		gc0="$(gc_count "$base")" t0="$(date +%s.%N)"
		CENTRIFUGO_CLIENT_TOKEN_HMAC_SECRET_KEY="$cf_secret" \
			"$LT" run "${args[@]}" -target "centrifugo:$base" "${more[@]+"${more[@]}"}" -summary-export "$sum" \
			>"$work/$side-$round.out" 2>&1 || rc=$?
		gc1="$(gc_count "$base")" t1="$(date +%s.%N)"
		stop "$cf_pid" && servers=()
		;;
	esac
	# GC cycles per second of the server over the whole run (set-up, the
	# connections' handshakes and the publish phase).
	awk -v a="${gc0:-}" -v b="${gc1:-}" -v t0="$t0" -v t1="$t1" 'BEGIN { if (a == "" || b == "" || t1 <= t0) print "nan"; else printf "%.2f\n", (b - a) / (t1 - t0) }' \
		>"$work/$side-$round.gcps"
	read -r st1 tt1 < <(han_steal_ticks)
	if [ "$rc" != 0 ]; then
		failed=1
		han_log "$side round $round: exit $rc: $(grep -E '✗|error' "$work/$side-$round.out" | head -n 3 | tr '\n' ' ')"
	fi
	jq -r --arg side "$side" --arg round "$round" --arg gcps "$(cat "$work/$side-$round.gcps")" \
		--arg steal "$(han_steal_pct "$st0" "$tt0" "$st1" "$tt1")" \
		"[\$side, \$round, $figures, \$gcps, \$steal, .passed] | map(if . == null then \"nan\" else . end) | @tsv" "$sum" >>"$results" 2>/dev/null ||
		printf '%s\t%s\tnan\tfalse\n' "$side" "$round" >>"$results"
	han_log "$side round $round: $(tail -n 1 "$results" | cut -f3- | tr '\t' ' ')"
}

han_log "$what; $reps rounds"
for round in $(seq 1 "$reps"); do
	order=(gateway centrifugo)
	[ $((round % 2)) = 0 ] && order=(centrifugo gateway)
	for side in "${order[@]}"; do run_one "$side" "$round"; done
done

echo
[ "${HAN_BC_CF_PRESENCE:-0}" = 1 ] && what="$what; Centrifugo with presence"
[ "${HAN_BC_CF_JOIN:-0}" = 1 ] && what="$what; Centrifugo with join/leave pushed"
[ -n "${HAN_BC_PROCS:-}" ] && what="$what; both servers at GOMAXPROCS=$HAN_BC_PROCS"
[ -n "${HAN_BC_GW_ENV:-}" ] && what="$what; the gateway with $HAN_BC_GW_ENV"
echo "Gateway vs $HAN_BC_CF_VERSION, $(date -u '+%Y-%m-%d %H:%M UTC'): $what, runs interleaved;" \
	"load avg $(cut -d' ' -f1-3 /proc/loadavg)."
[ "$scenario" = broadcast ] &&
	echo "CPU: seconds per 1M unique deliveries over the publish phase and drain (server, its redis-server, the generator)."
echo
awk -F'\t' -v names="$names" '
function median(s,   a, n, t, i, j) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) }
BEGIN { nf = split(names, name, "|"); line = "| server | round"; sep = "|---|---"
	for (k = 1; k <= nf; k++) { line = line " | " name[k]; sep = sep "|---" }
	print line " | passed |"; print sep "|---|" }
{ line = "| " $1 " | " $2
	for (k = 1; k <= nf; k++) { v = $(k + 2); line = line " | " (v == "nan" || v == "" ? "—" : sprintf("%.4g", v)); col[$1, k] = col[$1, k] " " v }
	print line " | " $NF " |" }
END {
	print ""; print "| median | gateway | Centrifugo | gateway ÷ Centrifugo |"; print "|---|---|---|---|"
	for (k = 1; k <= nf; k++) { g = median(col["gateway", k]); c = median(col["centrifugo", k])
		printf "| %s | %.4g | %.4g | %s |\n", name[k], g, c, (c + 0 ? sprintf("%.2f", g / c) : "—") } }' "$results"
if [ -n "$steps" ] && [ "$scenario" = broadcast ]; then
	echo
	for f in "$work"/gateway-*.json "$work"/centrifugo-*.json; do
		[ -r "$f" ] || continue
		echo "$(basename "$f" .json):"
		jq -r '.info | to_entries | map(select(.key | startswith("target_step_")))
			| sort_by(.key | ltrimstr("target_step_") | tonumber)[] | "  \(.key | ltrimstr("target_step_")) events/s: \(.value)"' "$f"
	done
fi
if [ "$failed" = 1 ]; then
	han_log "some runs failed their thresholds or did not finish (see above; -keep keeps the logs)"
	exit 1
fi
