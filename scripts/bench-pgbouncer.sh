#!/usr/bin/env bash
# scripts/bench-pgbouncer.sh — the REST send path straight to PostgreSQL vs
# through PgBouncer (transaction pooling, HAN_DB_EXEC_MODE=exec), in one run
# (docs/benchmarks.md, "PgBouncer").
#
#   scripts/bench-pgbouncer.sh                # rates 250 400 550 msgs/s
#   scripts/bench-pgbouncer.sh 300 500 700    # other rates
#
# One private PostgreSQL cluster with a private PgBouncer in front of it
# (go run ./internal/testenv/cmd/withpg -pgbouncer), one private
# redis-server, and three han-gateway processes on them: "direct"
# (DATABASE_URL on PostgreSQL, pgx's default exec mode), "direct-exec" (the
# same with HAN_DB_EXEC_MODE=exec: the protocol's share of the difference)
# and "pgbouncer" (DATABASE_URL on the bouncer, HAN_DB_EXEC_MODE=exec,
# HAN_DATABASE_DIRECT_URL on PostgreSQL). For each rate, the chat-fanout
# scenario (every message a POST /v1/dialogs/{id}/messages with an
# Idempotency-Key, delivered to every member, history read back) runs
# against each in turn, the first one rotating from rate to rate. A step is
# held when nothing failed, was lost or dropped and delivery p99 < 1 s.
# CPU per send is the CPU time (user + sys, /proc) that the gateway, the
# bouncer and the PostgreSQL processes spent during the step, less the
# run's setup (measured once per target by a 1 s run at 1 msg/s), divided
# by the messages sent.
#
# Environment: HAN_BENCH_USERS (default 1000), HAN_BENCH_DIALOGS (200),
# HAN_BENCH_DURATION (10s). The output ends with one line per target and
# rate. Everything it starts listens on loopback and is stopped at the end.
set -euo pipefail

HAN_SCRIPT=bench-pgbouncer.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

if [ "${1:-}" != --inner ]; then
	han_ensure_packages --pgbouncer --curl
	go build -o bin/ ./cmd/han-gateway ./cmd/hanctl ./cmd/han-loadtest || han_die "go build failed"
	exec go run ./internal/testenv/cmd/withpg -pgbouncer -- bash "$0" --inner "$@"
fi
shift
rates=("$@")
[ "${#rates[@]}" -gt 0 ] || rates=(250 400 550)
users="${HAN_BENCH_USERS:-1000}"
dialogs="${HAN_BENCH_DIALOGS:-200}"
duration="${HAN_BENCH_DURATION:-10s}"

work="$(mktemp -d "${TMPDIR:-/tmp}/han-bench-pgb.XXXXXX")"
pids=()
# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
	local p
	for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
	# the gateways drain first (not children of this shell: poll, do not wait)
	for _ in $(seq 1 200); do
		alive=0
		for p in "${pids[@]+"${pids[@]}"}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && break
		sleep 0.1
	done
	rm -rf "$work"
}
trap cleanup EXIT

direct="$HAN_TEST_DATABASE_URL"
bounced="$HAN_TEST_PGBOUNCER_URL"
PSQL="$(han_pg_bindir)/psql"
postmaster="$(head -n 1 "$(han_psql "$PSQL" "$direct" -X -qtA -c 'SHOW data_directory')/postmaster.pid")"

export HAN_ENV=dev HAN_REDIS_API_PASSWORD="bench-$RANDOM$RANDOM$RANDOM"
export HAN_JWT_DEV_HS256_SECRET="bench-secret-$RANDOM$RANDOM-0123456789abcdef"
export HAN_HMAC_SECRET="bench-hmac-0123456789"
bin/hanctl redis acl --out "$work/users.acl" >/dev/null
redis_ping() { # AUTH as api_backend and PING over the RESP inline protocol
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'AUTH api_backend %s\r\nPING\r\n' "$HAN_REDIS_API_PASSWORD" >&3
		read -r -t 2 a <&3 && read -r -t 2 b <&3 || exit 1
		[[ "$a" == +OK* && "$b" == +PONG* ]]
	) 2>/dev/null
}
redis_port=""
for _ in 1 2 3 4 5; do
	port="$(han_pick_port 0)"
	redis-server --port "$port" --bind 127.0.0.1 --aclfile "$work/users.acl" --dir "$work" --save '' \
		--appendonly no --daemonize no --logfile "$work/redis.log" </dev/null >/dev/null 2>&1 &
	pid=$!
	for _ in $(seq 1 50); do
		redis_ping "$port" && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if redis_ping "$port"; then
		pids+=("$pid") redis_port=$port
		break
	fi
	kill "$pid" 2>/dev/null || true
done
[ -n "$redis_port" ] || han_die "redis-server did not start: $(tail -n 3 "$work/redis.log")"
export REDIS_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/0"
export REDIS_REALTIME_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/1"
DATABASE_URL="$direct" bin/hanctl migrate >/dev/null

# start_gateway NAME DATABASE_URL [VAR=VALUE...]: prints "PID URL"; tries
# another free port when the picked one was taken in the meantime.
start_gateway() {
	local name=$1 db=$2 port pid attempt
	shift 2
	for attempt in 1 2 3 4 5; do
		port="$(han_pick_port 0)"
		# The URLs (passwords) are set before env: its environment, not its arguments.
		DATABASE_URL="$db" HAN_DATABASE_DIRECT_URL="$direct" \
			env HAN_HTTP_ADDR="127.0.0.1:$port" HAN_ALLOWED_ORIGINS="http://127.0.0.1:$port" HAN_INSTANCE_ID="bench-$name" \
			HAN_LOG_LEVEL=warn "$@" \
			bin/han-gateway -migrate=false </dev/null >"$work/$name.log" 2>&1 &
		pid=$!
		for _ in $(seq 1 150); do
			curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "$pid http://127.0.0.1:$port"
			return 0
		fi
		grep -q 'address already in use' "$work/$name.log" || break
	done
	han_die "$name gateway exited: $(tail -n 5 "$work/$name.log")"
}
read -r direct_pid direct_url < <(start_gateway direct "$direct")
[ -n "${direct_pid:-}" ] || exit 1
pids+=("$direct_pid")
read -r exec_pid exec_url < <(start_gateway direct-exec "$direct" HAN_DB_EXEC_MODE=exec)
[ -n "${exec_pid:-}" ] || exit 1
pids+=("$exec_pid")
read -r bouncer_gw_pid bouncer_url < <(start_gateway pgbouncer "$bounced" HAN_DB_EXEC_MODE=exec)
[ -n "${bouncer_gw_pid:-}" ] || exit 1
pids+=("$bouncer_gw_pid")

# cpu_ticks PID...: user + sys clock ticks of the processes, plus the
# reaped children's of each (backends that exited count on the postmaster).
cpu_ticks() {
	local t=0 p f
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		f="$(sed 's/.*) //' "/proc/$p/stat")"
		# fields after "(comm) ": 12 utime, 13 stime, 14 cutime, 15 cstime
		t=$((t + $(echo "$f" | awk '{print $12 + $13 + $14 + $15}')))
	done
	echo "$t"
}
pg_pids() { echo "$postmaster" $(pgrep -P "$postmaster" || true); }

hz="$(getconf CLK_TCK)"
declare -A setup_gw setup_db
# run TARGET RATE DURATION: one chat-fanout run; sets rc, sent, dgw, ddb
# (CPU ticks of the gateway and of the database side), load0, load1.
run() {
	local target=$1 rate=$2 dur=$3 url gw extra=() summary gw0 db0
	case "$target" in
	direct) url=$direct_url gw=$direct_pid ;;
	direct-exec) url=$exec_url gw=$exec_pid ;;
	*) url=$bouncer_url gw=$bouncer_gw_pid extra=("$HAN_TEST_PGBOUNCER_PID") ;;
	esac
	summary="$work/$target-$rate.json"
	load0="$(cut -d' ' -f1 /proc/loadavg)"
	gw0="$(cpu_ticks "$gw")" db0="$(cpu_ticks $(pg_pids) "${extra[@]+"${extra[@]}"}")"
	rc=0
	bin/han-loadtest run chat-fanout -target "$url" -users "$users" -dialogs "$dialogs" -rate "$rate" \
		-duration "$dur" -max-duration 4m -quiet -summary-export "$summary" \
		-threshold 'http_req_failed==0' -threshold 'delivery_lost==0' -threshold 'dropped_iterations==0' \
		-threshold 'delivery_p99<1s' >"$work/$target-$rate.out" 2>&1 || rc=$?
	dgw=$(($(cpu_ticks "$gw") - gw0)) ddb=$(($(cpu_ticks $(pg_pids) "${extra[@]+"${extra[@]}"}") - db0))
	load1="$(cut -d' ' -f1 /proc/loadavg)"
	# the POSTs of the measured phase: http_reqs' count in the summary
	sent="$(grep -A3 '"http_reqs": {' "$summary" | grep -oE '"count": [0-9]+' | grep -oE '[0-9]+' | head -n 1 || true)"
	sent="${sent:-0}"
}

# The setup of a run (users, dialogs, connections, history read-back) costs
# the same at every rate: one run at 1 msg/s for 1 s measures it, and it is
# subtracted from each step's CPU.
targets=(direct direct-exec pgbouncer)
for target in "${targets[@]}"; do
	run "$target" 1 1s
	[ "$rc" = 0 ] || han_die "$target: the setup run failed: $(grep -E '✗|error:' "$work/$target-1.out" | tr -s ' .' | tr '\n' ' ')"
	setup_gw[$target]=$dgw setup_db[$target]=$ddb
	han_log "$target: setup CPU gateway $((dgw * 1000 / hz)) ms, database side $((ddb * 1000 / hz)) ms"
done

results=()
i=0
for rate in "${rates[@]}"; do
	# rotate which target goes first, so none always meets a warmer machine
	order=("${targets[@]:i%3}" "${targets[@]:0:i%3}")
	i=$((i + 1))
	for target in "${order[@]}"; do
		run "$target" "$rate" "$duration"
		held=no
		[ "$rc" = 0 ] && held=yes
		line="$(awk -v t="$target" -v r="$rate" -v s="$sent" -v g=$((dgw - setup_gw[$target])) -v p=$((ddb - setup_db[$target])) \
			-v hz="$hz" -v h="$held" -v l0="$load0" -v l1="$load1" \
			'BEGIN { n = (s > 0 ? s : 1); printf "%-11s rate %4d/s held %-3s sent %6d  CPU/send: gateway %5.0f µs + database side %5.0f µs = %5.0f µs  load %s→%s", t, r, h, s, g / hz * 1e6 / n, p / hz * 1e6 / n, (g + p) / hz * 1e6 / n, l0, l1 }')"
		han_log "$line"
		[ "$rc" = 0 ] || han_log "$target at $rate/s not held: $(grep -E '✗|error:' "$work/$target-$rate.out" | tr -s ' .' | tr '\n' ' ')"
		results+=("$line")
	done
done
echo "== results (database side: PostgreSQL processes, plus PgBouncer for the pgbouncer target)"
printf '%s\n' "${results[@]}"
