#!/usr/bin/env bash
# scripts/fuzz.sh — run every fuzz target of the network-facing decoders
# briefly (CI) or longer (FUZZTIME=5m scripts/fuzz.sh).
#
#   FuzzParseCachePut  restapi/project cache PUT body and TTL token
#   FuzzCheck          internal/jsonx strict JSON (request bodies, frames)
#   FuzzCanonicalize   internal/jcs   publish payload normalisation
#   FuzzParseInFrame   gateway        WebSocket client frames
#
# The seed corpora also run in every plain `go test`. Packages whose
# TestMain starts Redis/PostgreSQL run under withpg like scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZTIME="${FUZZTIME:-5s}"
targets=(
	"FuzzParseCachePut ./restapi/project/"
	"FuzzCheck ./internal/jsonx/"
	"FuzzCanonicalize ./internal/jcs/"
	"FuzzParseInFrame ./gateway/"
)
# fuzz_once runs one target, printing its output; its status is go test's.
fuzz_once() {
	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -fuzz "^${1}\$" -fuzztime "$FUZZTIME" "$2" 2>&1 | tee "$out"
	return "${PIPESTATUS[0]}"
}

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	echo "== $name ($pkg, $FUZZTIME)"
	if fuzz_once "$name" "$pkg"; then
		continue
	fi
	# On a loaded host Go's fuzz engine can end a run with its own
	# "context deadline exceeded" while coordinating its workers, with no
	# input that fails. A failing input is always written under testdata/
	# and named in the output; only a run that names none is tried again,
	# once.
	if grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written to' "$out"; then
		echo "== $name: the fuzz engine stopped on its own deadline with no failing input; trying again"
		fuzz_once "$name" "$pkg"
		continue
	fi
	exit 1
done
