#!/usr/bin/env bash
# scripts/bench-ab.sh — unchanged-performance check of a refactor: the Go
# benchmarks and the load-test figures of docs/benchmarks.md, OLD vs NEW,
# interleaved A/B/A/B, median of 3, printed as new/old ratios.
#
#   scripts/bench-ab.sh OLD NEW              # two commits (NEW may be HEAD), ≈ 12 min
#   scripts/bench-ab.sh -reps 1 -short OLD NEW   # a quick try (≈ 3 min)
#
# Both commits are built in temporary git worktrees (removed at the end).
# Go benchmarks: each package's test binary is built once per tree
# (go test -c) and run in turn, old and new alternating and the first
# rotating from round to round: BenchmarkDecision (ratelimit),
# IdempotentSendOverhead (restapi), BenchmarkProjectQueue (store/project);
# the figure is the median ns/op over the rounds.
# Load tests: one private PostgreSQL (withpg), one redis-server and one
# han-gateway per tree (each migrated by its own hanctl, on its own
# database), driven by NEW's han-loadtest (the same instrument for both) at
# small bounded sizes, each phase ≤ 30 s:
#   broadcast     200 connections, 20 dialogs, 400 events/s for 8 s: delivery p99
#   connect-storm 500 clients, the arm's gateway restarted: storm_duration
#   rate-limit    GET /v1/me, 200 users, 16 VUs for 8 s: decisions/s (http_reqs rate)
#   chat-fanout   40 users in 8 dialogs, 16 sends/s for 8 s: delivery p99
# plus the arm's gateway CPU (user + sys, /proc) per phase. A ratio near 1
# means unchanged; read it against the spread of the rounds (printed).
#
# Options: -reps N (3), -count N (benchmark runs per round, 1), -short
# (Go benchmarks with a shorter -benchtime, load phases of 4 s), -budget
# MINUTES (15: refuse a longer estimate; the builds come on top), -phase SECONDS
# (each load phase, 8 by default: longer phases steady the p99s), -no-go /
# -no-load (skip a half), -keep (keep the work folder: summaries and logs).
set -euo pipefail

HAN_SCRIPT=bench-ab.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

reps=3 count=1 short=0 budget=15 do_go=1 do_load=1 keep=0
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	-reps) reps=$2 && shift ;;
	-count) count=$2 && shift ;;
	-short) short=1 ;;
	-phase) phase_arg=$2 && shift ;;
	-budget) budget=$2 && shift ;;
	-no-go) do_go=0 ;;
	-no-load) do_load=0 ;;
	-keep) keep=1 ;;
	--inner) break ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*) han_die "unknown option $1 (try --help)" ;;
	*) args+=("$1") ;;
	esac
	shift
done

if [ "${1:-}" != --inner ]; then
	[ "${#args[@]}" = 2 ] || han_die "usage: scripts/bench-ab.sh [options] OLD NEW"
	phase_s=8 bt_dec=2s bt_idem=500x bt_pq=5000x
	[ "$short" = 1 ] && phase_s=4 bt_dec=300ms bt_idem=100x bt_pq=500x
	[ -n "${phase_arg:-}" ] && phase_s="$phase_arg"
	# Go: ≈ 3 benchmarks × (2 trees × count × ≈ 12 s); load: 4 phases × 2 trees × ≈ 30 s.
	est=$(((do_go * reps * count * 3 * 2 * 12 + do_load * reps * 4 * 2 * (phase_s + 20) + 120) / 60))
	han_log "estimate: ≤ $est min ($reps rounds)"
	[ "$est" -le "$budget" ] || han_die "estimate $est min is over -budget $budget: fewer -reps or -short"
	han_ensure_packages --curl --jq --cc
	work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-ab.XXXXXX")"
	# shellcheck disable=SC2317 # the EXIT trap
	cleanup() {
		git worktree remove --force "$work/old" >/dev/null 2>&1 || true
		git worktree remove --force "$work/new" >/dev/null 2>&1 || true
		if [ "$keep" = 1 ]; then han_log "kept $work (summaries, logs)"; else rm -rf "$work"; fi
	}
	trap cleanup EXIT
	for side in old new; do
		rev="${args[0]}"
		[ "$side" = new ] && rev="${args[1]}"
		git worktree add --detach "$work/$side" "$rev" >/dev/null 2>&1 || han_die "git worktree add $rev failed"
		han_log "building $side ($rev)"
		(cd "$work/$side" && go build -o "$work/bin-$side/" ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest) || han_die "go build of $rev failed"
		if [ "$do_go" = 1 ]; then
			# The project queue benchmark moved from store to store/project:
			# take the folder that holds it in this tree.
			pqdir="$(cd "$work/$side" && grep -rl --include='*_test.go' '^func BenchmarkProjectQueue' store | head -n 1 | xargs dirname)"
			[ -n "$pqdir" ] || han_die "no BenchmarkProjectQueue in $rev"
			echo "$pqdir" >"$work/pqdir-$side"
			for pkg in ratelimit restapi "$pqdir"; do
				name="$(basename "$pkg")"
				[ "$pkg" = "$pqdir" ] && name=project
				(cd "$work/$side" && go test -c -o "$work/bin-$side/$name.test" "./$pkg/") || han_die "go test -c ./$pkg/ of $rev failed"
			done
		fi
	done
	HAN_AB_WORK="$work" HAN_AB_REPS="$reps" HAN_AB_COUNT="$count" HAN_AB_PHASE="$phase_s" HAN_AB_GO="$do_go" HAN_AB_LOAD="$do_load" \
		HAN_AB_BT="$bt_dec $bt_idem $bt_pq" HAN_AB_REVS="${args[0]} ${args[1]}" \
		go run ./internal/testenv/cmd/withpg -- bash "$0" --inner
	exit $?
fi

# --- inner: a private PostgreSQL is up (HAN_TEST_DATABASE_URL) --------------------
work="$HAN_AB_WORK" reps="$HAN_AB_REPS" count="$HAN_AB_COUNT" phase_s="$HAN_AB_PHASE"
read -r bt_dec bt_idem bt_pq <<<"$HAN_AB_BT"
read -r rev_old rev_new <<<"$HAN_AB_REVS"
results="$work/results.tsv" # kind name side round value
: >"$results"
pids=()
# shellcheck disable=SC2317 # the EXIT trap
cleanup_inner() {
	local p
	for f in "$work"/gw-*.pid; do [ -r "$f" ] && pids+=("$(cat "$f")"); done
	for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
	sleep 1
}
trap cleanup_inner EXIT

if [ "$HAN_AB_GO" = 1 ]; then
	benches=("ratelimit BenchmarkDecision $bt_dec" "restapi IdempotentSendOverhead $bt_idem" "project BenchmarkProjectQueue $bt_pq")
	declare -A pqdir=([old]="$(cat "$work/pqdir-old")" [new]="$(cat "$work/pqdir-new")")
	for round in $(seq 1 "$reps"); do
		order=(old new)
		[ $((round % 2)) = 0 ] && order=(new old)
		for b in "${benches[@]}"; do
			read -r pkg name bt <<<"$b"
			for side in "${order[@]}"; do
				han_log "go round $round: $name ($side)"
				d="$pkg"
				[ "$pkg" = project ] && d="${pqdir[$side]}"
				(cd "$work/$side/$d" && "$work/bin-$side/$pkg.test" -test.run '^$' -test.bench "$name" \
					-test.benchtime "$bt" -test.count "$count" 2>&1) >"$work/go-$pkg-$side-$round.out" || true
				# every "value unit" pair after the iteration count (ns/op and the
				# benchmark's own metrics, e.g. µs/send-key)
				awk -v s="$side" -v r="$round" '/^Benchmark/ && NF >= 4 { for (i = 3; i < NF; i += 2) print "go\t" $1 " " $(i + 1) "\t" s "\t" r "\t" $i }' \
					"$work/go-$pkg-$side-$round.out" >>"$results"
			done
		done
	done
fi

if [ "$HAN_AB_LOAD" = 1 ]; then
	han_bench_redis ab "$work/bin-new/hanctl" "$work"
	pids+=("$redis_pid")
	server="${HAN_TEST_DATABASE_URL%%\?*}"
	server="${server%/*}"
	PSQL="$(han_pg_bindir)/psql"
	declare -A url
	for side in old new; do
		han_psql "$PSQL" "$HAN_TEST_DATABASE_URL" -X -qtA -c "CREATE DATABASE han_ab_$side" >/dev/null
		db="$server/han_ab_$side?sslmode=disable"
		DATABASE_URL="$db" "$work/bin-$side/hanctl" migrate >/dev/null
		port="$(han_pick_port 0)"
		url[$side]="http://127.0.0.1:$port"
		# The restart command of connect-storm: SIGTERM, wait for the exit,
		# start again on the same port, wait for /readyz.
		cat >"$work/gw-$side.sh" <<EOF
#!/usr/bin/env bash
if [ -r "$work/gw-$side.pid" ]; then
	p=\$(cat "$work/gw-$side.pid"); kill -TERM "\$p" 2>/dev/null
	for _ in \$(seq 1 300); do kill -0 "\$p" 2>/dev/null || break; sleep 0.1; done
fi
HAN_HTTP_ADDR=127.0.0.1:$port DATABASE_URL='$db' HAN_LOG_LEVEL=warn HAN_DRAIN_DELAY=0 HAN_INSTANCE_ID=ab-$side \
	setsid "$work/bin-$side/han-gateway" -migrate=false </dev/null >>"$work/gw-$side.log" 2>&1 &
echo \$! >"$work/gw-$side.pid"
for _ in \$(seq 1 300); do curl -fsS "${url[$side]}/readyz" >/dev/null 2>&1 && exit 0; sleep 0.1; done
exit 1
EOF
		bash "$work/gw-$side.sh" || han_die "$side gateway did not start: $(tail -n 5 "$work/gw-$side.log")"
	done
	hz="$(getconf CLK_TCK)"
	ticks() { [ -r "/proc/$1/stat" ] && sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}' || echo 0; }
	LT="$work/bin-new/han-loadtest"
	# load NAME SIDE ROUND METRIC-JQ SCENARIO ARGS...
	load() {
		local name=$1 side=$2 round=$3 q=$4 sc=$5 pid g0 g1 v
		local out="$work/$sc-$side-$round"
		local sum="$out.json"
		shift 5
		pid="$(cat "$work/gw-$side.pid")" g0="$(ticks "$pid")"
		"$LT" run "$sc" -target "${url[$side]}" -quiet -summary-export "$sum" -max-duration 60s "$@" \
			>"$out.out" 2>&1 || han_log "$name $side round $round failed: $(grep -E '✗|error' "$out.out" | head -n 2 | tr '\n' ' ')"
		[ "$sc" = connect-storm ] && pid="$(cat "$work/gw-$side.pid")" g0=0 # a new process: its CPU since start
		g1="$(ticks "$pid")"
		v="$(jq -r "$q // empty" "$sum" 2>/dev/null || true)"
		printf 'load\t%s\t%s\t%s\t%s\n' "$name" "$side" "$round" "${v:-nan}" >>"$results"
		printf 'load\t%s gateway CPU s\t%s\t%s\t%s\n' "$name" "$side" "$round" "$(awk -v a="$g1" -v b="$g0" -v hz="$hz" 'BEGIN { printf "%.3f", (a - b) / hz }')" >>"$results"
		han_log "load round $round: $name ($side) = ${v:-nan}"
	}
	d="${phase_s}s"
	for round in $(seq 1 "$reps"); do
		order=(old new)
		[ $((round % 2)) = 0 ] && order=(new old)
		for side in "${order[@]}"; do
			load "broadcast delivery_p99 ms" "$side" "$round" '.metrics.delivery_latency.values["p(99)"]' broadcast \
				-conns 200 -dialogs 20 -rate 400 -duration "$d" # Redis from REDIS_REALTIME_URL, not an argument
		done
		for side in "${order[@]}"; do
			load "connect-storm storm_duration ms" "$side" "$round" '(.metrics.storm_duration.values.value / 1e6)' connect-storm \
				-conns 500 -dialogs 50 -wait 30s -restart-cmd "bash $work/gw-$side.sh"
		done
		for side in "${order[@]}"; do
			load "rate-limit decisions/s" "$side" "$round" '.metrics.http_reqs.values.rate' rate-limit \
				-users 200 -vus 16 -duration "$d"
		done
		for side in "${order[@]}"; do
			load "chat-fanout delivery_p99 ms" "$side" "$round" '.metrics.delivery_latency.values["p(99)"]' chat-fanout \
				-users 40 -dialogs 8 -rate 16 -duration "$d"
		done
	done
fi

echo
echo "A/B $(date -u '+%Y-%m-%d %H:%M UTC'): old $rev_old, new $rev_new; median of $reps rounds (A/B interleaved), load avg $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "| kind | figure | old (median) | new (median) | new/old | old rounds | new rounds |"
echo "|---|---|---|---|---|---|---|"
awk -F'\t' '
function median(s,   a, n, t, i, j) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) }
{ k = $1 SUBSEP $2; if (!(k in seen)) { seen[k] = 1; order[++nk] = k }; v[k, $3] = v[k, $3] " " $5 }
END { for (i = 1; i <= nk; i++) { k = order[i]; split(k, p, SUBSEP); o = median(v[k, "old"]); n = median(v[k, "new"])
	r = (o + 0 != 0 ? sprintf("%.3f", n / o) : "—")
	printf "| %s | %s | %.4g | %.4g | **%s** |%s |%s |\n", p[1], p[2], o, n, r, v[k, "old"], v[k, "new"] } }' "$results"
