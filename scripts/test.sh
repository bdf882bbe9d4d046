#!/usr/bin/env bash
# scripts/test.sh — the whole test suite, self-contained (the README's second command,
# `make test`).
#
#   scripts/test.sh                       # vet + gofmt + every package
#   scripts/test.sh ./restapi/            # vet + gofmt + one package
#   scripts/test.sh -run TestSend ./restapi/ ./store/
#   scripts/test.sh -run TestSend         # no package given: ./... is used
#   make test ARGS='-run TestSend ./restapi/'
#   scripts/test.sh --pgbouncer           # the bouncer suite (below)
#
# What it does:
#   1. installs redis-server, PostgreSQL and pgbouncer from the OS packages
#      when missing (apt-get; sudo when not root), and gcc when cgo has no C
#      compiler (-race);
#   2. `go vet ./...`, a gofmt check (lists unformatted files, fails) and
#      scripts/check-refs.sh (no citation of a document outside the repository),
#      scripts/check-kinds.sh (no error-kind classifier outside rds.Kind and
#      store.Kind), scripts/check-size.sh (no non-test Go file over 700 lines,
#      no function over 80, outside its allow-list) and scripts/deadcode.sh
#      (unreachable functions outside its allow-list; the pinned tool comes
#      through the module proxy);
#   3. `go test -race -count=1 -timeout 20m <ARGS>` through
#      `go run ./internal/testenv/cmd/withpg --`, which starts one private
#      PostgreSQL cluster (free port, data dir in /tmp; every connection needs
#      its random password, scram-sha-256, carried in HAN_TEST_DATABASE_URL)
#      for the run; every test package starts its own private redis-server(s).
#
# --pgbouncer (first argument): the bouncer suite. Every test database is
# reached through a private PgBouncer in transaction pooling mode
# (HAN_TEST_PGBOUNCER=1; the harness's direct URL stays for migrations),
# pgx in HAN_TEST_DB_EXEC_MODE (default exec). Without further arguments it
# runs the chat, idempotency and project API tests of ./restapi/ and
# ./store/ and the service's own run behind the bouncer; no -race, lint
# skipped (the plain run does both).
#
# Arguments: all of them go to `go test` after the defaults above (so a later
# -count or -timeout wins). If none of them is a package pattern — an argument
# starting with ./ ../ / or github.com/ — then ./... is appended.
#
# Environment:
#   DATABASE_URL or HAN_TEST_DATABASE_URL set: use that outside PostgreSQL
#     server instead of a private cluster (withpg is skipped; the Go harness
#     creates its databases there, so the role must be allowed to CREATE
#     DATABASE). The script says so at the start and in its summary.
#   HAN_TEST_NO_LINT=1: skip go vet, the gofmt check, check-refs, check-kinds,
#     check-size and deadcode.
#   HAN_TEST_NO_RACE=1: run without -race.
#
# Exit status: 0 when everything passed, non-zero otherwise. The last line is
# a summary: "packages: N passed, N failed" (packages without test files are
# counted on the line before it).
set -euo pipefail

HAN_SCRIPT=test.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

command -v go >/dev/null 2>&1 || han_die "go not found in PATH (install Go 1.26+)"

bouncer_suite=()
if [ "${1:-}" = --pgbouncer ]; then
	shift
	export HAN_TEST_PGBOUNCER=1 HAN_TEST_NO_RACE=1 HAN_TEST_NO_LINT=1
	han_log "bouncer suite: PostgreSQL through a private PgBouncer (transaction pooling), exec mode ${HAN_TEST_DB_EXEC_MODE:-exec}"
	bouncer_suite=(-run '^(TestChat|TestDialog|TestNonMember|TestConcurrent|TestClientMessage|TestHistory|TestIdempot|TestExpiredIdempotency|TestRedisLoss|TestCrashedOwner|TestProject|TestQueue|TestRequestPathInEveryExecMode|TestSend|TestHundredMembers|TestABatch|TestASend|TestRelayPublishes|TestRunsBehindPgBouncer|TestEndToEndDialogRoundTrip)' ./restapi/ ./store/ ./cmd/han-gateway/)
fi

race=(-race)
[ "${HAN_TEST_NO_RACE:-}" = 1 ] && race=()
if [ "${#race[@]}" -gt 0 ]; then
	han_ensure_packages --cc --pgbouncer --node
	export CGO_ENABLED=1
else
	han_ensure_packages --pgbouncer --node
fi
han_sdk_deps

start=$(date +%s)
status=0
lint="skipped"

if [ "${HAN_TEST_NO_LINT:-}" != 1 ]; then
	han_log "go vet ./..."
	if go vet ./...; then
		lint="vet ok"
	else
		lint="vet FAILED"
		status=1
	fi
	han_log "gofmt check"
	unformatted="$(han_gofmt_unformatted)"
	if [ -n "$unformatted" ]; then
		han_log "gofmt: these files are not formatted (run gofmt -w):"
		printf '%s\n' "$unformatted" | sed 's/^/  /' >&2
		lint="$lint, gofmt FAILED"
		status=1
	else
		lint="$lint, gofmt ok"
	fi
	han_log "scripts/check-refs.sh"
	if "$HAN_ROOT/scripts/check-refs.sh"; then
		lint="$lint, check-refs ok"
	else
		lint="$lint, check-refs FAILED"
		status=1
	fi
	if "$HAN_ROOT/scripts/check-kinds.sh"; then
		lint="$lint, check-kinds ok"
	else
		lint="$lint, check-kinds FAILED"
		status=1
	fi
	if "$HAN_ROOT/scripts/check-size.sh"; then
		lint="$lint, check-size ok"
	else
		lint="$lint, check-size FAILED"
		status=1
	fi
	if "$HAN_ROOT/scripts/deadcode.sh"; then
		lint="$lint, deadcode ok"
	else
		lint="$lint, deadcode FAILED"
		status=1
	fi
	han_log "tsc --checkJs (web/sdk)"
	if (cd "$HAN_ROOT/web/sdk" && node_modules/.bin/tsc -p jsconfig.json); then
		lint="$lint, sdk types ok"
	else
		lint="$lint, sdk types FAILED"
		status=1
	fi
fi

args=("$@")
[ "$#" -eq 0 ] && args=("${bouncer_suite[@]+"${bouncer_suite[@]}"}")
has_pkg=0
for a in "${args[@]+"${args[@]}"}"; do
	case "$a" in
	./* | ../* | /* | github.com/*) has_pkg=1 ;;
	esac
done
[ "$has_pkg" = 1 ] || args+=(./...)

gotest=(go test "${race[@]+"${race[@]}"}" -count=1 -timeout 20m "${args[@]}")
outside=""
if [ -n "${HAN_TEST_DATABASE_URL:-}" ] || [ -n "${DATABASE_URL:-}" ]; then
	# Only host:port is shown: the URL may carry a password.
	outside="$(printf '%s' "${HAN_TEST_DATABASE_URL:-$DATABASE_URL}" | sed -E 's#^[a-z]+://##; s#^[^@/]*@##; s#[/?].*$##')"
	outside="outside PostgreSQL server ${outside:-on the default socket} from ${HAN_TEST_DATABASE_URL:+HAN_TEST_DATABASE_URL}${HAN_TEST_DATABASE_URL:-DATABASE_URL}"
	han_log "using an $outside, not a private cluster: each test package creates and drops a database there (unset the variable for a private cluster); Redis is still private"
	cmd=("${gotest[@]}")
else
	cmd=(go run ./internal/testenv/cmd/withpg -- "${gotest[@]}")
fi

log="$(mktemp "${TMPDIR:-/tmp}/han-test.XXXXXX")"
trap 'rm -f "$log"' EXIT
han_log "${cmd[*]}"
test_status=0
"${cmd[@]}" 2>&1 | tee "$log" || test_status=$?
[ "$test_status" -ne 0 ] && status=1

passed=$(grep -c '^ok[[:space:]]' "$log" || true)
failed=$(grep -cE '^FAIL[[:space:]]+[^[:space:]]+[[:space:]]' "$log" || true)
notests=$(grep -cE '^\?[[:space:]].*\[no test files\]' "$log" || true)
if [ "$test_status" -ne 0 ] && [ "$failed" -eq 0 ]; then
	failed=1 # build failure or harness error before any package result
fi
failing="$(grep -E '^--- FAIL: ' "$log" | sed 's/^--- FAIL: //; s/ (.*//' | sort -u | paste -sd " " - || true)"

secs=$(($(date +%s) - start))
if [ "$status" -eq 0 ]; then
	han_log "PASS: $lint, go test ok (${secs}s)"
else
	[ -n "$failing" ] && han_log "failing tests: $failing"
	han_log "FAIL: $lint, go test $([ "$test_status" -eq 0 ] && echo ok || echo "FAILED (exit $test_status)") (${secs}s)"
fi
[ -n "$outside" ] && han_log "this run used an $outside"
han_log "$notests package(s) without test files"
echo "packages: $passed passed, $failed failed"
exit "$status"
