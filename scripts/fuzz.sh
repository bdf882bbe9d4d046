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
for t in "${targets[@]}"; do
	read -r name pkg <<<"$t"
	echo "== $name ($pkg, $FUZZTIME)"
	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
done
