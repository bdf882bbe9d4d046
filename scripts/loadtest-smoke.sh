#!/usr/bin/env bash
# scripts/loadtest-smoke.sh — the load-test smoke against the REAL gateway
# (`make loadtest`, run by .ci/run after the test suite).
#
#   scripts/loadtest-smoke.sh            # start the local stack, run the smoke, stop the stack
#   scripts/loadtest-smoke.sh --against-running
#                                        # use a `make dev` stack that is already up (.data/run/stack.env)
#
# It starts scripts/dev.sh in the background (private PostgreSQL + Redis under
# .data/, bin/han-gateway with HAN_DEBUG_ENDPOINTS=1), waits until the stack
# wrote .data/run/stack.env, then runs three short scenarios with bin/han-loadtest
# with lenient thresholds, so a broken delivery path fails (exit non-zero):
#   1. broadcast: 200 WebSocket connections over 20 dialogs, 400 events/s
#      PUBLISHed straight into the dialogs' Redis channels for 8 s (3,200
#      events, 32,000 deliveries): the Pub/Sub → hub → socket path;
#   2. chat-fanout: 20 users in 4 dialogs, 8 messages/s over
#      POST /v1/dialogs/{id}/messages for 8 s: the REST send → outbox/publish →
#      socket path, plus the history read-back;
#   3. chat-fanout -hot-dialog: 20 users in one dialog, every one sending,
#      5 messages/s for 8 s: concurrent sends into one dialog, whose history
#      must hold every accepted message once and in the order the sends were
#      answered (history_missing, history_duplicates, history_reordered == 0;
#      delivery p99 < 3 s there: one slow send is 20 members' deliveries).
# Thresholds: delivery_lost==0, no duplicates, delivery_p99 < 1 s,
# publish_failed / http_req_failed < 1 %, ws_connect_p95 < 2 s. Each scenario
# is bounded (-max-duration 40s); the stack start is bounded by 5 min.
# The smoke stays inside the built-in rate-limit policies (docs/benchmarks.md,
# "Load tests"): 220 users × 1 GET /v1/me, 25 dialog creates, ≤ 5 sends/s per
# dialog (60 per 10 s allowed) — nothing to relax.
#
# Exit status: 0 passed, 99 a threshold failed, 1 the stack or a run failed.
# Environment: those of scripts/dev.sh; HAN_SMOKE_SUMMARY_DIR (default
# .data/loadtest) receives the --summary-export JSON of each scenario.
set -euo pipefail

HAN_SCRIPT=loadtest-smoke.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

running=0
for a in "$@"; do
	case "$a" in
	--against-running) running=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) han_die "unknown argument $a (try --help)" ;;
	esac
done

DATA="$HAN_ROOT/.data"
STACK_ENV="$DATA/run/stack.env"
SUMMARIES="${HAN_SMOKE_SUMMARY_DIR:-$DATA/loadtest}"
mkdir -p "$SUMMARIES"

dev_pid=""
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$dev_pid" ] && kill -0 "$dev_pid" 2>/dev/null; then
		han_log "stopping the stack (dev.sh pid $dev_pid)"
		kill -TERM "$dev_pid" 2>/dev/null || true
		# dev.sh stops the gateway (≤ 20 s), redis (≤ 30 s) and PostgreSQL itself.
		for _ in $(seq 1 900); do
			kill -0 "$dev_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$dev_pid" 2>/dev/null && kill -KILL "$dev_pid" 2>/dev/null
		wait "$dev_pid" 2>/dev/null || true
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$running" = 0 ]; then
	rm -f "$STACK_ENV"
	mkdir -p "$DATA/logs"
	han_log "starting the local stack (scripts/dev.sh; log .data/logs/dev-smoke.log)"
	HAN_DEBUG_ENDPOINTS=1 bash scripts/dev.sh </dev/null >"$DATA/logs/dev-smoke.log" 2>&1 &
	dev_pid=$!
	for _ in $(seq 1 3000); do # 5 min: the first run builds and runs initdb
		[ -s "$STACK_ENV" ] && break
		if ! kill -0 "$dev_pid" 2>/dev/null; then
			tail -n 20 "$DATA/logs/dev-smoke.log" >&2
			han_die "scripts/dev.sh exited before the stack was up"
		fi
		sleep 0.1
	done
	[ -s "$STACK_ENV" ] || han_die "the stack was not up after 5 min; see .data/logs/dev-smoke.log"
else
	[ -s "$STACK_ENV" ] || han_die "no running stack (.data/run/stack.env missing): start make dev first"
	go build -o bin/ ./cmd/han-loadtest || han_die "go build ./cmd/han-loadtest failed"
fi
set -a
# shellcheck source=/dev/null
. "$DATA/secrets.env"
# shellcheck source=/dev/null
. "$STACK_ENV"
set +a
han_log "stack up at $HAN_BASE_URL"

LT=(bin/han-loadtest run)
common=(-target "$HAN_BASE_URL" -threshold 'delivery_lost==0' -threshold 'delivery_duplicates==0'
	-threshold 'delivery_p99<1s' -threshold 'ws_connect_p95<2s' -max-duration 40s)

history=(-threshold 'history_missing==0' -threshold 'history_duplicates==0' -threshold 'history_reordered==0')

rc=0
han_log "smoke 1/3: broadcast (Redis Pub/Sub → gateway → 200 sockets)"
"${LT[@]}" broadcast "${common[@]}" -redis-url "$REDIS_REALTIME_URL" -conns 200 -dialogs 20 -rate 400 \
	-duration 8s -threshold 'publish_failed<1%' -summary-export "$SUMMARIES/smoke-broadcast.json" || rc=$?
if [ "$rc" = 0 ]; then
	han_log "smoke 2/3: chat-fanout (POST /v1/dialogs/{id}/messages → 20 sockets + history)"
	"${LT[@]}" chat-fanout "${common[@]}" -users 20 -dialogs 4 -rate 8 -duration 8s \
		-threshold 'http_req_failed<1%' "${history[@]}" \
		-summary-export "$SUMMARIES/smoke-chat-fanout.json" || rc=$?
fi
if [ "$rc" = 0 ]; then
	han_log "smoke 3/3: chat-fanout -hot-dialog (20 senders into one dialog; history once and in order)"
	# Its point is loss, duplicates and order: one slow send reaches all 20
	# members, so with 40 sends its delivery p99 is one request's latency —
	# bounded more loosely than the other runs'.
	"${LT[@]}" chat-fanout -target "$HAN_BASE_URL" -max-duration 40s -hot-dialog -users 20 -rate 5 -duration 8s \
		-threshold 'delivery_lost==0' -threshold 'delivery_duplicates==0' -threshold 'delivery_p99<3s' \
		-threshold 'ws_connect_p95<2s' -threshold 'http_req_failed<1%' "${history[@]}" \
		-summary-export "$SUMMARIES/smoke-chat-fanout-hot.json" || rc=$?
fi
if [ "$rc" = 0 ]; then
	han_log "smoke: PASSED"
else
	han_log "smoke: FAILED (exit $rc; gateway log .data/logs/gateway.log)"
fi
exit "$rc"
