#!/usr/bin/env bash
# scripts/bench-cluster.sh — the gateway's fan-out on a Redis Cluster: sharded
# vs classic Pub/Sub, and one vs three gateway instances, runs interleaved,
# median of the rounds (docs/benchmarks.md, "Redis Cluster: sharded vs
# classic Pub/Sub").
#
#   scripts/bench-cluster.sh           # 3 rounds × 3 arms of a 20 s broadcast, ≈ 6 min
#   scripts/bench-cluster.sh -short    # 1 round × 3 arms of a 5 s broadcast, ≈ 1 min (a smoke run)
#   scripts/bench-cluster.sh -reps 5 -conns 3000 -dialogs 300 -rate 1000
#
# It starts its own servers on loopback and stops them all at the end: one
# PostgreSQL cluster (withpg), one Redis Cluster of 3 masters with -replicas
# replicas each (withcluster: every node loads the cluster ACL, the cluster
# is created through the admin user, the gateways connect as api_backend;
# REDIS_URL and REDIS_REALTIME_URL both name it) and, per run, fresh gateways:
#   sharded      one gateway, HAN_PUBSUB_MODE=sharded (SSUBSCRIBE on every
#                master, SPUBLISH to the channel's master);
#   classic      one gateway, HAN_PUBSUB_MODE=classic (SUBSCRIBE on one
#                node; every PUBLISH is forwarded to every node of the cluster);
#   sharded-3gw  three gateways, HAN_PUBSUB_MODE=sharded, the connections
#                spread over them (han-loadtest -target URL,URL,…): each event
#                reaches every instance holding a member of its dialog.
# Every run is `han-loadtest run broadcast` with the same shape for -phase
# seconds (events published straight into Redis, as docs/benchmarks.md
# "(a) Broadcast fan-out" does; -pubsub-mode as the arm's gateways), with
# the thresholds delivery_lost==0 and delivery_duplicates==0. Each round runs
# every arm once, the first arm rotating from round to round. CPU: user + sys
# from /proc (han-loadtest -cpu-pid) of every gateway and every redis-server
# of the cluster, from the first publish to the end of the drain, summed and
# given in CPU-ms per 1,000 deliveries (= CPU-s per 1M); the generator's
# own is shown apart. The table: each run, then per arm the medians and the
# ratios classic ÷ sharded and sharded-3gw ÷ sharded. The load average is
# printed before and after.
# Exit status: 0 every run passed its thresholds, 1 otherwise.
#
# Options: -short (reps 1, phase 5, conns 300, dialogs 30, rate 300,
# budget 2), -reps N (3), -conns N (1500), -dialogs N (150: 10 members
# each), -rate N (800 events/s: 8,000 deliveries/s), -payload N (128 bytes),
# -phase SECONDS (20), -replicas N (1), -arms LIST
# (sharded,classic,sharded-3gw), -budget MINUTES (10, counted from the
# start, build included: no run starts that would end past it, and the table
# shows the runs done; a run still going 30 s past it is killed, exit 124),
# -keep (keep the work folder: summaries and logs). Each run is also bounded by han-loadtest
# -max-duration (phase + 90 s + 1 s per 50 connections).
set -euo pipefail

HAN_SCRIPT=bench-cluster.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

if [ "${1:-}" != --inner ]; then
	reps=3 conns=1500 dialogs=150 rate=800 payload=128 phase=20 replicas=1 keep=0 budget=10
	arms=sharded,classic,sharded-3gw
	while [ $# -gt 0 ]; do
		case "$1" in
		-short) reps=1 phase=5 conns=300 dialogs=30 rate=300 budget=2 ;;
		-budget) budget=$2 && shift ;;
		-reps) reps=$2 && shift ;;
		-conns) conns=$2 && shift ;;
		-dialogs) dialogs=$2 && shift ;;
		-rate) rate=$2 && shift ;;
		-payload) payload=$2 && shift ;;
		-phase) phase=$2 && shift ;;
		-replicas) replicas=$2 && shift ;;
		-arms) arms=$2 && shift ;;
		-keep) keep=1 ;;
		-h | --help)
			sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
			exit 0
			;;
		*) han_die "unknown argument $1 (try --help)" ;;
		esac
		shift
	done
	for v in "$reps" "$conns" "$dialogs" "$rate" "$payload" "$phase" "$budget"; do
		case "$v" in '' | 0 | *[!0-9]*) han_die "option values must be positive integers, got '$v'" ;; esac
	done
	case "$replicas" in '' | *[!0-9]*) han_die "-replicas: want 0 or more, got '$replicas'" ;; esac
	for a in ${arms//,/ }; do
		case "$a" in sharded | classic | sharded-3gw) ;; *) han_die "-arms: unknown arm '$a' (sharded, classic, sharded-3gw)" ;; esac
	done
	deadline=$(($(date +%s) + budget * 60))
	han_ensure_packages --curl --jq
	work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-cluster.XXXXXX")"
	# shellcheck disable=SC2317 # the EXIT trap
	cleanup() {
		if [ "$keep" = 1 ]; then han_log "kept $work (summaries, logs)"; else rm -rf "$work"; fi
	}
	trap cleanup EXIT
	mkdir -p "$work/bin"
	han_log "building han-gateway, hanctl, han-loadtest, withpg, withcluster"
	go build -o "$work/bin/" ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest \
		./internal/testenv/cmd/withpg ./internal/testenv/cmd/withcluster || han_die "go build failed"
	rc=0
	HAN_BC_WORK="$work" HAN_BC_SHAPE="$reps $conns $dialogs $rate $payload $phase" HAN_BC_ARMS="$arms" HAN_BC_DEADLINE="$deadline" \
		timeout -k 20 "$((deadline - $(date +%s) + 30))" "$work/bin/withpg" -- "$work/bin/withcluster" -replicas "$replicas" -- bash "$0" --inner || rc=$?
	[ "$rc" = 124 ] && han_log "killed 30 s past the -budget of $budget min (a run did not end)"
	exit "$rc"
fi

# --- inner: PostgreSQL (HAN_TEST_DATABASE_URL) and the cluster (HAN_TEST_CLUSTER_*) are up ---
work="$HAN_BC_WORK"
read -r reps conns dialogs rate payload phase <<<"$HAN_BC_SHAPE"
read -r -a arms <<<"${HAN_BC_ARMS//,/ }"
read -r -a redis_pids <<<"$HAN_TEST_CLUSTER_PIDS"
servers=() # gateway pids this script started and has not stopped
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
cleanup_inner() { stop "${servers[@]+"${servers[@]}"}"; }
trap cleanup_inner EXIT

export HAN_ENV=dev HAN_JWT_DEV_HS256_SECRET="cl-$(han_random_hex 24)" HAN_HMAC_SECRET="cl-$(han_random_hex 12)"
export REDIS_URL="$HAN_TEST_CLUSTER_URL" REDIS_REALTIME_URL="$HAN_TEST_CLUSTER_URL"
DATABASE_URL="$HAN_TEST_DATABASE_URL" "$work/bin/hanctl" migrate >/dev/null || han_die "hanctl migrate failed"

# ready PID URL: wait up to 30 s for URL to answer 2xx; fails early when PID exits.
ready() {
	for _ in $(seq 1 300); do
		curl -fsS "$2" >/dev/null 2>&1 && return 0
		kill -0 "$1" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
# start_gateway MODE N: a fresh gateway (instance N) on a free port, ready
# when it returns; appends its pid to servers and its base URL to gw_urls.
start_gateway() {
	local mode=$1 n=$2 try port pid
	for try in 1 2 3; do
		port="$(han_pick_port 0)"
		HAN_HTTP_ADDR="127.0.0.1:$port" DATABASE_URL="$HAN_TEST_DATABASE_URL" HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=0 \
			HAN_PUBSUB_MODE="$mode" HAN_INSTANCE_ID="bench-cl-$n" "$work/bin/han-gateway" -migrate=false \
			</dev/null >>"$work/gateway-$n.log" 2>&1 &
		pid=$!
		if ready "$pid" "http://127.0.0.1:$port/readyz"; then
			servers+=("$pid")
			gw_urls+=("http://127.0.0.1:$port")
			return 0
		fi
		stop "$pid"
		han_log "gateway $n did not start on port $port (try $try)"
	done
	han_die "gateway $n did not become ready: $(tail -n 5 "$work/gateway-$n.log")"
}

results="$work/results.tsv" # arm, round, the figures, passed
: >"$results"
failed=0
LT="$work/bin/han-loadtest"
args=(broadcast -conns "$conns" -dialogs "$dialogs" -rate "$rate" -payload "$payload"
	-threshold 'delivery_lost==0' -threshold 'delivery_duplicates==0'
	-duration "${phase}s" -max-duration "$((phase + 90 + conns / 50))s" -quiet)
what="broadcast, $conns connections over $dialogs dialogs, $rate events/s of $payload B for ${phase}s per run"
names="deliveries/s|p99 ms|lost|duplicated|gateways CPU-ms/1k|redis CPU-ms/1k|gateways+redis CPU-ms/1k|generator CPU-ms/1k"
# The summary's info holds target_cpu_s_per_1m_<name> per -cpu-pid process:
# gw<N> for the gateways, redis<N> for the cluster's nodes.
figures='(.info | to_entries) as $cpu
	| ([$cpu[] | select(.key | startswith("target_cpu_s_per_1m_gw")) | .value] | add) as $gw
	| ([$cpu[] | select(.key | startswith("target_cpu_s_per_1m_redis")) | .value] | add) as $redis
	| .metrics.delivery_rate.values.value, .metrics.delivery_latency.values["p(99)"],
	(.metrics.delivery_lost.values.count // 0), (.metrics.delivery_duplicates.values.count // 0),
	$gw, $redis, (if $gw and $redis then $gw + $redis else null end), .info.target_cpu_s_per_1m_generator'
run_one() { # ARM ROUND: on fresh gateways, stopped after the run
	local arm=$1 round=$2 sum="$work/$1-$2.json" rc=0 mode=sharded n=1 i more=()
	case "$arm" in classic) mode=classic ;; sharded-3gw) n=3 ;; esac
	gw_urls=()
	for i in $(seq 1 "$n"); do start_gateway "$mode" "$i"; done
	for i in "${!servers[@]}"; do more+=(-cpu-pid "gw$((i + 1))=${servers[$i]}"); done
	for i in "${!redis_pids[@]}"; do more+=(-cpu-pid "redis$((i + 1))=${redis_pids[$i]}"); done
	"$LT" run "${args[@]}" -target "$(
		IFS=,
		echo "${gw_urls[*]}"
	)" -redis-url "$REDIS_REALTIME_URL" -pubsub-mode "$mode" \
		"${more[@]}" -summary-export "$sum" >"$work/$arm-$round.out" 2>&1 || rc=$?
	stop "${servers[@]}" && servers=()
	if [ "$rc" != 0 ]; then
		failed=1
		han_log "$arm round $round: exit $rc: $(grep -E '✗|error' "$work/$arm-$round.out" | head -n 3 | tr '\n' ' ')"
	fi
	jq -r --arg arm "$arm" --arg round "$round" \
		"[\$arm, \$round, $figures, .passed] | map(if . == null then \"nan\" else . end) | @tsv" "$sum" >>"$results" 2>/dev/null ||
		printf '%s\t%s\tnan\tfalse\n' "$arm" "$round" >>"$results"
	han_log "$arm round $round: $(tail -n 1 "$results" | cut -f3- | tr '\t' ' ')"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
han_log "$what; arms ${arms[*]}; $reps round(s); cluster nodes: $HAN_TEST_CLUSTER_ADDRS"
# A run is not started unless one as long as the longest so far still ends
# before the -budget deadline (with 20 s for the teardown); the table then
# shows the runs done.
longest=0
for round in $(seq 1 "$reps"); do
	k=$(((round - 1) % ${#arms[@]}))
	for j in "${!arms[@]}"; do
		if [ $(($(date +%s) + longest + 20)) -gt "$HAN_BC_DEADLINE" ]; then
			han_log "the -budget leaves no time for another run: stopping before round $round's ${arms[$(((j + k) % ${#arms[@]}))]}"
			failed=1
			break 2
		fi
		t0=$(date +%s)
		run_one "${arms[$(((j + k) % ${#arms[@]}))]}" "$round"
		longest=$((longest > $(date +%s) - t0 ? longest : $(date +%s) - t0))
	done
done

echo
echo "Redis Cluster ($(wc -w <<<"$HAN_TEST_CLUSTER_PIDS") redis-server nodes, 3 masters), $(date -u '+%Y-%m-%d %H:%M UTC'):" \
	"$what, arms interleaved; load avg $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after."
echo "CPU: ms per 1,000 unique deliveries over the publish phase and drain (every gateway, every redis-server, the generator)."
echo
awk -F'\t' -v names="$names" -v arms="${arms[*]}" '
function median(s,   a, n, t, i, j) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) }
function ratio(x, y) { return (y + 0 && x != "" ? sprintf("%.2f", x / y) : "—") }
BEGIN { nf = split(names, name, "|"); na = split(arms, arm, " "); line = "| arm | round"; sep = "|---|---"
	for (k = 1; k <= nf; k++) { line = line " | " name[k]; sep = sep "|---" }
	print line " | passed |"; print sep "|---|" }
{ line = "| " $1 " | " $2
	for (k = 1; k <= nf; k++) { v = $(k + 2); line = line " | " (v == "nan" || v == "" ? "—" : sprintf("%.4g", v)); if (v != "nan" && v != "") col[$1, k] = col[$1, k] " " v }
	print line " | " $NF " |" }
END {
	print ""; line = "| median"; sep = "|---"
	for (a = 1; a <= na; a++) { line = line " | " arm[a]; sep = sep "|---" }
	print line " | classic ÷ sharded | sharded-3gw ÷ sharded |"; print sep "|---|---|"
	for (k = 1; k <= nf; k++) { line = "| " name[k]
		for (a = 1; a <= na; a++) { m[arm[a]] = (col[arm[a], k] == "" ? "" : median(col[arm[a], k])); line = line " | " (m[arm[a]] == "" ? "—" : sprintf("%.4g", m[arm[a]])) }
		print line " | " ratio(m["classic"], m["sharded"]) " | " ratio(m["sharded-3gw"], m["sharded"]) " |" } }' "$results"
if [ "$failed" = 1 ]; then
	han_log "some runs failed their thresholds or did not finish (see above; -keep keeps the logs)"
	exit 1
fi
