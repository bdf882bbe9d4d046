#!/usr/bin/env bash
# scripts/bench-storm.sh — a reconnect storm after an instance restart, with
# the missed events recovered over the socket (docs/benchmarks.md,
# "(c) Connect storm").
#
#   scripts/bench-storm.sh                         # 1,000 clients, 100 dialogs, 20 messages/s, ≈ 1 min
#   scripts/bench-storm.sh -conns 10000 -dialogs 1000 -send-rate 50 -reps 3
#
# It starts its own servers on loopback, all stopped at the end: a private
# PostgreSQL (withpg), a private redis-server and one han-gateway built from
# this tree, restartable by a script the generator calls. Per round,
# `han-loadtest run connect-storm` connects -conns clients (each subscribed
# to one dialog), then restarts the gateway (SIGTERM: drain, close 1001 with
# retry advice; start again; wait for /readyz) while -send-rate messages/s
# go into the dialogs over REST; every client reconnects as advised and
# resubscribes with sinceSeq, so the server replays what it missed.
# Thresholds: storm_gaps==0 (no resubscribe left a gap), storm_behind==0
# (after the storm every client has every sent message). The client waits
# at least the retryMs the server advised by construction (not measured).
# Per round it prints the first connect's rate, the storm as the restarted
# instance saw it (first accepted handshake → last client resubscribed) and
# that against N ÷ the connect rate, close-1013 refusals, replayed events,
# resyncs, REST reads and the gateway's CPU.
#
# Options: -conns N (1000), -dialogs N (100), -send-rate N (20),
# -concurrency N (200: the first connect's clients at a time), -reps N (1),
# -keep (keep the work folder), -profile SECONDS (a CPU profile of each restarted
# instance over its first SECONDS of serving, storm-<n>.prof in the kept work
# folder, and its top functions on stdout). Environment: HAN_DRAIN_DELAY for the
# gateway (default 0: it closes its sockets as soon as it is signalled).
set -euo pipefail

HAN_SCRIPT=bench-storm.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

if [ "${1:-}" != --inner ]; then
	conns=1000 dialogs=100 rate=20 conc=200 reps=1 keep=0 profile=0
	while [ $# -gt 0 ]; do
		case "$1" in
		-conns) conns=$2 ;;
		-dialogs) dialogs=$2 ;;
		-send-rate) rate=$2 ;;
		-concurrency) conc=$2 ;;
		-reps) reps=$2 ;;
		-keep) keep=1 && shift && continue ;;
		-profile) profile=$2 keep=1 ;;
		-h | --help)
			sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
			exit 0
			;;
		*) han_die "unknown argument $1 (try --help)" ;;
		esac
		shift 2 || han_die "$1 needs a value"
	done
	han_ensure_packages --curl --jq
	work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-storm.XXXXXX")"
	chmod 711 "$work"
	# shellcheck disable=SC2317 # the EXIT trap
	finish() { if [ "$keep" = 1 ]; then han_log "kept $work"; else rm -rf "$work"; fi; }
	trap finish EXIT
	han_log "building han-gateway, hanctl, han-loadtest"
	go build -o "$work/bin/" ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest
	HAN_STORM_WORK="$work" HAN_STORM_ARGS="$conns $dialogs $rate $conc $reps $profile" \
		go run ./internal/testenv/cmd/withpg -- bash "$0" --inner
	exit $?
fi

# --- inner: a private PostgreSQL is up (HAN_TEST_DATABASE_URL) --------------------
work="$HAN_STORM_WORK"
read -r conns dialogs rate conc reps profile <<<"$HAN_STORM_ARGS"
pids=()
# shellcheck disable=SC2317 # the EXIT trap
cleanup_inner() {
	[ -r "$work/gw.pid" ] && pids+=("$(cat "$work/gw.pid")")
	for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
	sleep 1
}
trap cleanup_inner EXIT

han_bench_redis storm "$work/bin/hanctl" "$work"
pids+=("$redis_pid")
db="$HAN_TEST_DATABASE_URL"
DATABASE_URL="$db" "$work/bin/hanctl" migrate >/dev/null
port="$(han_pick_port 0)"
url="http://127.0.0.1:$port"
# The restart command: SIGTERM, wait for the exit, start again on the same
# port, wait for /readyz. The send and history routes' limits are raised so
# the storm's own traffic is never denied (the limiter still runs).
# It holds DATABASE_URL (the password): readable by this account alone.
(umask 077 && : >"$work/gw.sh")
cat >"$work/gw.sh" <<EOF
#!/usr/bin/env bash
if [ -r "$work/gw.pid" ]; then
	p=\$(cat "$work/gw.pid"); kill -TERM "\$p" 2>/dev/null
	for _ in \$(seq 1 300); do kill -0 "\$p" 2>/dev/null || break; sleep 0.1; done
fi
HAN_HTTP_ADDR=127.0.0.1:$port DATABASE_URL='$db' HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=${HAN_DRAIN_DELAY:-0} HAN_DEBUG_ENDPOINTS=1 \
	HAN_INSTANCE_ID=storm HAN_MAX_CONNECTIONS=19000 setsid "$work/bin/han-gateway" -migrate=false </dev/null >>"$work/gw.log" 2>&1 &
echo \$! >"$work/gw.pid"
for _ in \$(seq 1 300); do
	if curl -fsS "$url/readyz" >/dev/null 2>&1; then
		# A restart of a round (the marker names it): its serving profiled.
		if [ "$profile" -gt 0 ] && [ -r "$work/profile.next" ]; then
			name=\$(cat "$work/profile.next") && rm -f "$work/profile.next"
			setsid curl -fsS -o "$work/\$name" "$url/debug/pprof/profile?seconds=$profile" </dev/null >/dev/null 2>>"$work/profile.err" &
		fi
		exit 0
	fi
	sleep 0.1
done
exit 1
EOF
PSQL="$(han_pg_bindir)/psql"
"$PSQL" -X -qtA -d "$db" -c "INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES
  ('POST /v1/dialogs/{id}/messages', 'sliding', 'fail-closed', '[{\"family\":\"user\",\"limit\":100000000,\"windowMs\":10000}]'),
  ('GET /v1/dialogs/{id}/messages', 'fixed', 'local', '[{\"family\":\"user\",\"limit\":100000000,\"windowMs\":10000}]')
  ON CONFLICT (route) DO UPDATE SET algorithm = EXCLUDED.algorithm, on_failure = EXCLUDED.on_failure,
  rules = EXCLUDED.rules, updated_at = now()" >/dev/null
bash "$work/gw.sh" || han_die "the gateway did not start: $(tail -n 5 "$work/gw.log")"
hz="$(getconf CLK_TCK)"
ticks() { [ -r "/proc/$1/stat" ] && sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}' || echo 0; }

echo "Reconnect storm, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores: $conns clients in $dialogs dialogs, $rate messages/s sent during the storm, HAN_DRAIN_DELAY=${HAN_DRAIN_DELAY:-0}."
echo
echo "| round | first connect | storm (first accepted handshake → last resubscribed) | ÷ (N ÷ connect rate) | close-1013 | replayed | resyncs | gaps | behind | REST reads | gateway CPU s (new instance) | load avg |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
rc=0 refusals=""
for round in $(seq 1 "$reps"); do
	sum="$work/storm-$round.json"
	l0="$(cut -d' ' -f1 /proc/loadavg)"
	[ "$profile" -gt 0 ] && echo "storm-$round.prof" >"$work/profile.next"
	"$work/bin/han-loadtest" run connect-storm -target "$url" -quiet -summary-export "$sum" -max-duration 10m \
		-conns "$conns" -dialogs "$dialogs" -connect-concurrency "$conc" -send-rate "$rate" -wait 5m \
		-restart-cmd "bash $work/gw.sh" -threshold 'storm_gaps==0' -threshold 'storm_behind==0' \
		>"$work/storm-$round.out" 2>&1 || rc=$?
	l1="$(cut -d' ' -f1 /proc/loadavg)"
	# The restarted instance's refusals by reason and its recovery reads.
	curl -fsS "$url/metrics" 2>/dev/null | grep -E '^han_ws_(rejected_total|recover_reads_total|recoveries_total)' |
		sed 's/^/  /' >"$work/storm-$round.metrics" || true
	cpu="$(awk -v a="$(ticks "$(cat "$work/gw.pid")")" -v hz="$hz" 'BEGIN { printf "%.1f", a / hz }')"
	[ -s "$sum" ] || han_die "round $round: no summary: $(tail -n 5 "$work/storm-$round.out")"
	jq -r --arg r "$round" --arg cpu "$cpu" --arg ld "$l0→$l1" --argjson n "$conns" '.metrics as $m
		| def v(k): ($m[k].values.value // $m[k].values.count // 0);
		(v("storm_serve_duration") / 1e9) as $serve | v("connect_rate") as $rate
		| "| \($r) | \($rate | floor)/s | \($serve * 100 | floor / 100) s | \(if $rate > 0 then ($serve * $rate / $n * 100 | floor / 100) else "—" end)× | \($m["errors{status=-,code=ws_close_1013}"].values.count // 0) | \(v("storm_replayed")) | \(v("storm_resyncs")) | \(v("storm_gaps")) | \(v("storm_behind")) | \(v("storm_rest_reads")) | \($cpu) | \($ld) |"' "$sum"
	refusals="$refusals
round $round: $(tr -s ' ' <"$work/storm-$round.metrics" | tr '\n' ';')"
	bash "$work/gw.sh" >/dev/null 2>&1 || true # a fresh instance for the next round's first connect
done
echo
echo "The restarted instance's counters (refusals by reason, recovery reads and answers):$refusals"
if [ "$profile" -gt 0 ]; then
	sleep 1
	for f in "$work"/storm-*.prof; do
		[ -s "$f" ] || continue
		echo
		echo "CPU profile of the restarted instance's first ${profile}s ($(basename "$f")):"
		go tool pprof -top -nodecount=30 "$work/bin/han-gateway" "$f" 2>/dev/null | sed -n '4,36p'
	done
fi
[ "$rc" = 0 ] || han_log "a round failed its thresholds (exit $rc): see $work/storm-*.out (-keep)"
exit "$rc"
