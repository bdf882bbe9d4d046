#!/usr/bin/env bash
# scripts/check-kinds.sh — one error classifier: an error's class (the
# "kind" of log lines and metric labels) is named by rds.Kind in
# store/rds/kind.go, and store.Kind in store/pgerr.go adds PostgreSQL's
# error codes to it. A second function that turns an error into a kind
# string drifts from them (a sentinel it forgets, another name for the same
# failure), so every other package calls one of the two.
#
#   scripts/check-kinds.sh     # exit 0: none; exit 1: prints the offenders
#
# It searches the non-test Go files (git grep) for a function whose name
# contains "kind" (any case), that takes an error and returns a string.
# Called by scripts/test.sh beside go vet and the gofmt check (skipped with
# HAN_TEST_NO_LINT=1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The classifier files, the only places such a function may live.
classifiers='store/rds/kind.go|store/pgerr.go'

pattern='^func (\([^)]*\) )?[A-Za-z0-9_]*[Kk][Ii][Nn][Dd][A-Za-z0-9_]*\([^)]*\berror\b[^)]*\) *(\(?[^{]*\bstring\b)'

hits="$(git grep -nE "$pattern" -- '*.go' ':!*_test.go' | grep -vE "^($classifiers):" || true)"
if [ -n "$hits" ]; then
	echo "check-kinds: error-kind classifiers outside $classifiers (call rds.Kind or store.Kind instead):" >&2
	printf '%s\n' "$hits" >&2
	exit 1
fi
