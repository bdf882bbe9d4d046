#!/usr/bin/env bash
# scripts/check-refs.sh — the repository must stand alone: code, comments,
# Lua, scripts and docs state each rule in the project's own words (or link a
# doc of this repository) instead of citing a document a reader cannot open:
# an outside contract and its numbered sections, source specifications,
# tracker issue numbers, or "part 1/2" labels of a delivery plan.
#
#   scripts/check-refs.sh      # exit 0: no citation; exit 1: prints them
#
# It searches every tracked file (git grep) for the pattern below. A hit is
# accepted only when it matches an entry of the allow-list in this file; every
# entry carries the reason it is allowed. An entry that no longer matches any
# hit is reported (as a warning) so it can be deleted.
#
# Called by scripts/test.sh beside go vet and the gofmt check (skipped with
# HAN_TEST_NO_LINT=1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

pattern='CONTRACT|[Cc]ontract is silent|§|seed (§|[0-9]|R[0-9]|module)|[Ii]ssue [0-9]+|\b[Pp]art [12]\b|\b[Tt]he issue(.s)?\b|\bR[0-9]{1,2}(/R[0-9]{1,2})?\b|(^|[ (])#[0-9]{1,4}\b|[Ss]pec(ification)? section'

# Allow-list, one entry per line: PATH|TEXT|REASON. A hit is allowed when its
# file is PATH and its line contains TEXT (an empty TEXT allows every hit of
# the file). Keep it short: rewriting the line is almost always the fix.
allow_list='
scripts/check-refs.sh||this check: it has to spell out the pattern it searches for
docs/loadtest.md|-step-rates R1,R2|a flag value placeholder, not a requirement id
scripts/bench-centrifugo.sh|-steps R1,R2|a flag value placeholder, not a requirement id
'

# -I: binary files (images, fuzz corpora) are not prose; their bytes may
# match "§" by chance.
hits="$(git grep -I -nE "$pattern" || true)"

declare -A used=()
bad=()
while IFS= read -r hit; do
	[ -n "$hit" ] || continue
	file="${hit%%:*}"
	rest="${hit#*:}"
	text="${rest#*:}"
	allowed=0
	while IFS='|' read -r a_path a_text _; do
		[ -n "$a_path" ] || continue
		if [ "$file" = "$a_path" ] && [[ "$text" == *"$a_text"* ]]; then
			allowed=1
			used["$a_path|$a_text"]=1
			break
		fi
	done <<<"$allow_list"
	[ "$allowed" = 1 ] || bad+=("$hit")
done <<<"$hits"

while IFS='|' read -r a_path a_text _; do
	[ -n "$a_path" ] || continue
	if [ -z "${used["$a_path|$a_text"]:-}" ]; then
		printf 'check-refs: warning: allow-list entry matches nothing, delete it: %s|%s\n' "$a_path" "$a_text" >&2
	fi
done <<<"$allow_list"

if [ "${#bad[@]}" -gt 0 ]; then
	printf 'check-refs: %d line(s) cite a document outside the repository; state the rule itself or link a doc under docs/:\n' "${#bad[@]}"
	printf '%s\n' "${bad[@]}"
	exit 1
fi
echo "check-refs: ok"
