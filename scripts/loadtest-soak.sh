#!/usr/bin/env bash
# scripts/loadtest-soak.sh — the repeatable fault soak (`han-loadtest run soak`,
# docs/testing.md "Fault soak"). Builds han-gateway and han-loadtest into a
# temporary folder and runs the soak, which starts its own stack there: two
# gateway instances (HAN_INSTANCE_LIVENESS_TTL=2s), a private redis-server
# (the rendered ACL, AOF) behind a fault proxy, a private PostgreSQL. Faults
# follow a schedule drawn from the seed; any broken invariant or a recovery
# over 5 s fails the run. Never touches servers someone else runs.
#
#   scripts/loadtest-soak.sh                              # SOAK_DURATION=3m SOAK_SEED=1
#   SOAK_DURATION=30m SOAK_SEED=42 scripts/loadtest-soak.sh
#
# Environment: SOAK_DURATION (traffic and faults; the queue drain and the
# final checks add up to ~2 min), SOAK_SEED, SOAK_SUMMARY (the JSON report,
# default .data/loadtest/soak.json), SOAK_KEEP=1 keeps the working folder
# (gateway, Redis and PostgreSQL logs) and prints its path.
#
# Exit status: 0 passed, 1 the soak found a violation or could not run, 99 a
# threshold failed. The run is bounded (duration + 5 min); every process it
# starts dies with it.
set -euo pipefail

HAN_SCRIPT=loadtest-soak.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

case "${1:-}" in
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
"") ;;
*) han_die "unknown argument $1 (try --help)" ;;
esac

DURATION="${SOAK_DURATION:-3m}"
SEED="${SOAK_SEED:-1}"
SUMMARY="${SOAK_SUMMARY:-$HAN_ROOT/.data/loadtest/soak.json}"
mkdir -p "$(dirname "$SUMMARY")"

han_ensure_packages
W="$(mktemp -d /tmp/han-soak-XXXXXX)"
# PostgreSQL runs as the "postgres" user when this runs as root: it must
# traverse the folder.
chmod 711 "$W"
lt_pid=""
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$lt_pid" ] && kill -0 "$lt_pid" 2>/dev/null; then
		kill -TERM "$lt_pid" 2>/dev/null || true
		for _ in $(seq 1 300); do
			kill -0 "$lt_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$lt_pid" 2>/dev/null || true
	fi
	# The soak's children die with it (parent-death signal); this only
	# reaps a straggler whose command line names our own folder.
	for p in /proc/[0-9]*; do
		if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$W/"; then
			kill -KILL "${p#/proc/}" 2>/dev/null || true
		fi
	done
	if [ "${SOAK_KEEP:-}" = 1 ]; then
		han_log "kept $W"
	else
		rm -rf "$W"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

han_log "building han-gateway and han-loadtest"
go build -o "$W/bin/" ./cmd/han-gateway ./cmd/han-loadtest || han_die "go build failed"
mkdir -p "$W/stack"

# han-loadtest bounds the run at duration + 5 min (the queue drain takes
# at most 90 s, the final checks seconds); the soak's context ends there.
han_log "soak: duration $DURATION, seed $SEED"
rc=0
"$W/bin/han-loadtest" run soak -duration "$DURATION" -seed "$SEED" \
	-work-dir "$W/stack" -progress-interval 30s -summary-export "$SUMMARY" \
	-threshold 'soak_violations==0' -threshold 'soak_recovery_max<5s' </dev/null &
lt_pid=$!
wait "$lt_pid" || rc=$?
lt_pid=""
if [ "$rc" = 0 ]; then
	han_log "soak: PASSED (report $SUMMARY)"
else
	han_log "soak: FAILED (exit $rc; report $SUMMARY)"
	for f in "$W"/stack/gateway*.log; do
		[ -s "$f" ] || continue
		han_log "last lines of $(basename "$f"):"
		tail -n 15 "$f" >&2
	done
fi
exit "$rc"
