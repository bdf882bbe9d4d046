#!/usr/bin/env bash
# scripts/check-size.sh — files and functions stay small enough to read: a
# non-test Go file over 700 lines or a function over 80 lines fails, unless
# the allow-list below names it with the reason it stands. The fix is a split
# by concern (one file per job, one function per phase); an exception is for
# code whose length is its content (one table, one linear setup), not for
# code nobody split yet.
#
#   scripts/check-size.sh     # exit 0: none; exit 1: prints the offenders
#
# The measuring is scripts/check-size.go (go/ast, run with `go run`): it
# reads the allow-list on stdin, one entry a line, "<file glob> <reason>" for
# a file or "<file glob>:<Func> <reason>" for a function (methods as
# Recv.Method). Called by scripts/test.sh beside go vet and the gofmt check
# (skipped with HAN_TEST_NO_LINT=1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

go run scripts/check-size.go -file 700 -func 80 <<'ALLOW'
cmd/han-gateway/app.go:Main.Run the service's start-up order read top to bottom: each step needs the one before
cmd/hanctl/sizing.go:cmdSizing one flag set and one printed report of the sizing formula, no branch to split out
internal/config/config.go:Load one read and check per environment variable, a table in code form
internal/jsonx/jsonx.go:scanner.object the object state machine of the raw-body scanner; splitting it costs a call per key on the hot path
loadtest/scenarios/project_queue.go:ProjectQueue.Run one scenario script read top to bottom (topic set-up, producers, consumers, drain, report), each phase a few lines that share its counters
loadtest/soak/soak.go:runner.run the soak's phases in order (stack, traffic, fault schedule, final check), one linear script
loadtest/soak/soak.go:runner.finalCheck one invariant after another at the end of a run, each a few lines
loadtest/soak/traffic.go:listener.session one client's connect, catch-up and read loop, as the docs tell clients to do it
ALLOW
