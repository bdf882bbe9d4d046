#!/usr/bin/env bash
# scripts/deadcode.sh — fails when the module holds a function no program
# reaches (called by scripts/test.sh's lint step; runs on its own too).
#
# Two runs of golang.org/x/tools/cmd/deadcode, pinned below and fetched
# through the module proxy by `go run pkg@version` (nothing to install):
#
#   1. from the binaries' main functions only: every function reported must
#      match an entry of ALLOW — code production does not need but tests,
#      benchmarks or the docs do, each entry with its reason. An entry that no
#      longer matches anything fails too, so the list cannot go stale.
#   2. with -test (the test binaries are roots too): nothing may be reported;
#      this also covers the test-harness packages run 1 allows as a whole.
#
# Exit status: 0 when both runs are clean, 1 otherwise (the offending
# functions are listed with their file:line).
set -euo pipefail

HAN_SCRIPT=deadcode.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

DEADCODE=golang.org/x/tools/cmd/deadcode@v0.52.0

# "package function" patterns (package relative to the module, function as
# deadcode names it: Func, Type.Method; shell globs allowed).
ALLOW=(
	# Test harness packages: only _test.go files (and withpg, for part of
	# testenv) import them; run 2 still checks they hold no dead code.
	"internal/testenv *"
	"internal/testenv/apicheck *"
	"internal/testenv/browser *"
	"internal/faultproxy *"
	# The frame-schema checker of the realtime test clients (gateway,
	# cmd/han-gateway): only their _test.go files import it.
	"internal/wsschema *"
	# The whole-program tests drive the real Main and need its bound
	# addresses; the program itself logs them from the fields.
	"cmd/han-gateway Main.Addr"
	"cmd/han-gateway Main.URL"
	"cmd/han-gateway Main.MetricsAddr"
	# One executor of the three docs/loadtest.md documents; its tests pin
	# the schedule, no scenario uses it yet.
	"loadtest RampingVUs.*"
	# The script-level tests and BenchmarkDecision evaluate one script
	# directly; production goes through Decide.
	"ratelimit Eval"
)

module="$(go list -m)"
format='{{range .Funcs}}{{$.Path}} {{.Name}} {{.Position.File}}:{{.Position.Line}}{{"\n"}}{{end}}'
status=0

han_log "go run $DEADCODE ./... (allow-list: ${#ALLOW[@]} entries)"
report="$(go run "$DEADCODE" -f "$format" ./...)"
used=()
while read -r pkg fn pos; do
	[ -n "$pkg" ] || continue
	rel="${pkg#"$module"/}"
	ok=0
	for i in "${!ALLOW[@]}"; do
		# shellcheck disable=SC2254 # the allow-list entries are globs
		case "$rel $fn" in
		${ALLOW[$i]})
			ok=1
			used[i]=1
			;;
		esac
	done
	if [ "$ok" = 0 ]; then
		han_log "unreachable: $rel.$fn ($pos): delete it, or add it to ALLOW in scripts/deadcode.sh with the reason"
		status=1
	fi
done <<<"$report"
for i in "${!ALLOW[@]}"; do
	if [ -z "${used[i]:-}" ]; then
		han_log "allow-list entry \"${ALLOW[$i]}\" matches nothing deadcode reports: remove it"
		status=1
	fi
done

han_log "go run $DEADCODE -test ./..."
report="$(go run "$DEADCODE" -test -f "$format" ./...)"
while read -r pkg fn pos; do
	[ -n "$pkg" ] || continue
	han_log "unreachable even from the tests: ${pkg#"$module"/}.$fn ($pos): delete it"
	status=1
done <<<"$report"

[ "$status" = 0 ] && han_log "no dead code"
exit "$status"
