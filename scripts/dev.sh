#!/usr/bin/env bash
# scripts/dev.sh — a working local HAN stack with the browser client
# (the README's first command, `make dev`).
#
#   scripts/dev.sh           # start everything, print URL + demo tokens, run until Ctrl-C
#   scripts/dev.sh --check   # start everything, do a message round trip, stop, exit 0/1
#                            # (same as HAN_DEV_EXIT_AFTER_READY=1 scripts/dev.sh)
#   scripts/dev.sh --env     # print `export` lines for the running stack:
#                            #   eval "$(scripts/dev.sh --env)"; bin/hanctl token --sub ...
#   scripts/dev.sh --stop    # stop the running stack (started in another shell or
#                            # in the background with &), as Ctrl-C would
#   scripts/dev.sh --cluster # the same stack on a local Redis Cluster (3 masters,
#                            # 3 replicas) with TWO gateways; with --check the round
#                            # trip crosses them (scripts/dev-cluster.sh)
#
# On a Debian/Ubuntu machine with Go it:
#   - installs redis-server, postgresql (and curl) from the OS packages when missing;
#   - keeps all state in the git-ignored .data/ folder of the repo:
#       .data/secrets.env  generated once (mode 600): HAN_JWT_DEV_HS256_SECRET,
#                          HAN_HMAC_SECRET, HAN_REDIS_API_PASSWORD (api_backend),
#                          HAN_DEV_PG_PASSWORD (PostgreSQL's superuser postgres)
#       .data/pg/          PostgreSQL cluster (data/, socket, postgres.log); when
#                          the repo is not reachable by the postgres user (root
#                          runs PostgreSQL as `postgres`) or the path is too long
#                          for a unix socket, /var/tmp/han-dev-<hash>/pg instead
#                          (the path is written to .data/pg.location)
#       .data/redis/       users.acl (rendered by hanctl), AOF and RDB files
#       .data/logs/        gateway.log, redis.log, initdb.log
#       .data/demo.json    output of `hanctl seed demo` (user ids, tokens, dialog)
#       .data/run/stack.env  while the stack runs (mode 600): HAN_BASE_URL,
#                          DATABASE_URL, REDIS_URL, REDIS_REALTIME_URL, HAN_ENV
#                          (the URLs carry their passwords)
#                          (scripts/loadtest-smoke.sh, --env)
#       .data/run/dev.pid  while the stack runs: the pid of dev.sh (--stop)
#   - starts a private PostgreSQL (127.0.0.1, port 55432 or a free one,
#     database `han`; over TCP the superuser postgres needs its password,
#     HAN_DEV_PG_PASSWORD: every account on the machine reaches 127.0.0.1;
#     without one only on the unix socket, in the pg folder of mode 700 that
#     only this account enters; pg_hba.conf is rewritten so at every start,
#     which also closes a cluster an older dev.sh made with trust over TCP),
#     a private redis-server (127.0.0.1, port 56379 or a
#     free one, ACL file with the default user off, AOF everysec), builds ./bin,
#     runs `hanctl migrate` and `hanctl seed demo`, starts bin/han-gateway on
#     HAN_HTTP_ADDR (default 127.0.0.1:8080, a free port when that is busy) and
#     waits for /readyz;
#   - on Ctrl-C / SIGTERM stops the gateway, redis-server and PostgreSQL
#     (pg_ctl stop -m fast). Running it again reuses .data/.
# It never touches the shared servers on 5432/6379. `make clean` removes .data/.
#
# Environment: HAN_HTTP_ADDR, HAN_ALLOWED_ORIGINS, HAN_ENV (default dev),
# HAN_LOG_LEVEL, HAN_DRAIN_DELAY (default 0: no load balancer watches the dev
# gateway), HAN_DEV_PG_PORT (55432), HAN_DEV_REDIS_PORT (56379; 0 = any free
# port, also for HAN_HTTP_ADDR), HAN_DEV_EXIT_AFTER_READY=1 (= --check),
# HAN_DEV_DATA (default .data: the state folder; another one runs a second,
# separate stack), HAN_DEV_CLUSTER=1 (= --cluster), HAN_DEV_TOKEN_TTL (default
# 1h: the lifetime of the printed demo tokens and sign-in links; a Go duration).
#
# The demo tokens are short-lived on purpose: a sign-in link stays in the
# browser's history, token included, so it should be dead soon after. Mint a
# fresh token or link for the running stack with hanctl:
#   eval "$(scripts/dev.sh --env)"; bin/hanctl token --sub <user id> --ttl 1h
#   echo "$HAN_BASE_URL/#token=$(bin/hanctl token --sub <user id> --ttl 1h)"
#
# --cluster: instead of the one redis-server, six cluster nodes on 57001-57006
# (cluster bus +1000; HAN_DEV_REDIS_PORT moves the first, 0 = free ports),
# created afresh on every start as the admin user han_admin
# (HAN_REDIS_ADMIN_PASSWORD in .data/secrets.env), each loaded with
# `hanctl redis acl --cluster`; REDIS_URL and REDIS_REALTIME_URL are the same
# cluster URL (api_backend, addr= list of the other nodes). A second gateway listens on the
# first one's port + 1 (or a free one); .data/run/stack.env then also holds
# HAN_BASE_URL_2 and HAN_BASE_URLS (both, comma-separated: han-loadtest's
# -target list). --check posts on the first gateway and reads back on the
# second, then runs `han-loadtest run chat-fanout` with a socket on each
# gateway: every message sent through one must reach the socket on the other.
set -euo pipefail

# A shell starting a job with & makes it ignore SIGINT, and bash cannot trap
# a signal ignored on entry: without this, Ctrl-C (or kill -INT, --stop)
# would not stop a stack started in the background. Re-exec once with
# SIGINT back at its default, where env can do that.
if [ -z "${HAN_DEV_SIGNALS_RESET:-}" ] && env --default-signal=INT true 2>/dev/null; then
	export HAN_DEV_SIGNALS_RESET=1
	exec env --default-signal=INT bash "${BASH_SOURCE[0]}" "$@"
fi

HAN_SCRIPT=dev.sh
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HAN_ROOT"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

check=0
mode=run
cluster=0
[ "${HAN_DEV_EXIT_AFTER_READY:-}" = 1 ] && check=1
[ "${HAN_DEV_CLUSTER:-}" = 1 ] && cluster=1
for a in "$@"; do
	case "$a" in
	--check) check=1 ;;
	--cluster) cluster=1 ;;
	--env) mode=env ;;
	--stop) mode=stop ;;
	-h | --help)
		usage
		exit 0
		;;
	*) han_die "unknown argument $a (try --help)" ;;
	esac
done

DATA="${HAN_DEV_DATA:-$HAN_ROOT/.data}"

# running_dev_pid: the pid of this repo's running dev.sh, when there is one.
running_dev_pid() {
	local pid
	[ -s "$DATA/run/dev.pid" ] || return 1
	pid="$(cat "$DATA/run/dev.pid")"
	[ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'dev\.sh' || return 1
	printf '%s\n' "$pid"
}

case "$mode" in
env)
	# The running stack's addresses and the dev secrets, for hanctl and curl.
	[ -s "$DATA/run/stack.env" ] && running_dev_pid >/dev/null ||
		han_die "no running stack (start scripts/dev.sh first; its addresses appear once it is ready)"
	(
		set -a
		# shellcheck source=/dev/null
		. "$DATA/run/stack.env"
		# shellcheck source=/dev/null
		. "$DATA/secrets.env"
		for v in HAN_BASE_URL DATABASE_URL REDIS_URL REDIS_REALTIME_URL HAN_ENV \
			HAN_JWT_DEV_HS256_SECRET HAN_HMAC_SECRET HAN_REDIS_API_PASSWORD HAN_DEV_PG_PASSWORD; do
			printf 'export %s=%q\n' "$v" "${!v:-}"
		done
		# A cluster stack's second gateway, and both as one list.
		for v in HAN_BASE_URL_2 HAN_BASE_URLS; do
			if [ -n "${!v:-}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
		done
	)
	exit 0
	;;
stop)
	pid="$(running_dev_pid)" || {
		han_log "no running stack for $DATA"
		exit 0
	}
	han_log "stopping the stack (dev.sh pid $pid)"
	# SIGINT, as Ctrl-C: dev.sh stops the gateway, redis-server and PostgreSQL.
	kill -INT "$pid"
	for _ in $(seq 1 900); do
		# Gone, or a zombie its parent (a shell that started it with &) has
		# not reaped yet.
		grep -q '^State:[[:space:]]*[^Z[:space:]]' "/proc/$pid/status" 2>/dev/null || {
			han_log "stopped"
			exit 0
		}
		sleep 0.1
	done
	han_die "dev.sh (pid $pid) still running after 90s; see $DATA/logs/"
	;;
esac

if [ "$cluster" = 1 ]; then
	# shellcheck source=scripts/dev-cluster.sh
	. "$HAN_ROOT/scripts/dev-cluster.sh"
fi

command -v go >/dev/null 2>&1 || han_die "go not found in PATH (install Go 1.26+)"
han_ensure_packages --curl --jq
PGBIN="$(han_pg_bindir)" || han_die "PostgreSQL binaries not found"

mkdir -p "$DATA/redis" "$DATA/logs" "$DATA/run"
chmod 755 "$DATA" # the postgres user may need to traverse it
chmod 700 "$DATA/redis" "$DATA/run"

# One dev.sh per repo: a second one would fight over the same data.
exec 9>"$DATA/run/dev.lock"
if command -v flock >/dev/null 2>&1; then
	flock -n 9 || han_die "another scripts/dev.sh is already running for this repo (lock $DATA/run/dev.lock; scripts/dev.sh --stop stops it)"
fi
echo "$$" >"$DATA/run/dev.pid"

is_root=0
[ "$(id -u)" -eq 0 ] && is_root=1
if [ "$is_root" = 1 ]; then
	id postgres >/dev/null 2>&1 || han_die "running as root and there is no 'postgres' system user to run PostgreSQL"
fi

# pg_run CMD...: run a PostgreSQL tool as the postgres user when root.
pg_run() {
	if [ "$is_root" = 1 ]; then
		(cd "$PGBASE" && runuser -u postgres -- "$@" 9>&-)
	else
		(cd "$PGBASE" && "$@" 9>&-)
	fi
}

# pg_base_usable DIR: create DIR for the cluster and check that the user
# running PostgreSQL can write it and that a socket path in it fits.
pg_base_usable() {
	local d="$1"
	[ "${#d}" -le 90 ] || return 1
	mkdir -p "$d" || return 1
	chmod 700 "$d"
	if [ "$is_root" = 1 ]; then
		chown postgres: "$d" || return 1
		runuser -u postgres -- test -w "$d" -a -x "$d" 2>/dev/null || return 1
	fi
	return 0
}

PGBASE="$DATA/pg"
if ! pg_base_usable "$PGBASE"; then
	rmdir "$PGBASE" 2>/dev/null || true
	pg_key="$HAN_ROOT"
	[ "$DATA" = "$HAN_ROOT/.data" ] || pg_key="$DATA"
	PGBASE="/var/tmp/han-dev-$(han_hash "$pg_key")/pg"
	mkdir -p "$(dirname "$PGBASE")"
	chmod 755 "$(dirname "$PGBASE")"
	pg_base_usable "$PGBASE" || han_die "cannot prepare a PostgreSQL directory ($DATA/pg or $PGBASE)"
	printf '%s\n' "$PGBASE" >"$DATA/pg.location"
	han_log "PostgreSQL data lives in $PGBASE (the repo path is not usable by the postgres user)"
else
	rm -f "$DATA/pg.location"
fi
PGDATA="$PGBASE/data"
# A cluster made by another major version needs that version's binaries.
if [ -s "$PGDATA/PG_VERSION" ] && [ -x "/usr/lib/postgresql/$(cat "$PGDATA/PG_VERSION")/bin/pg_ctl" ]; then
	PGBIN="/usr/lib/postgresql/$(cat "$PGDATA/PG_VERSION")/bin"
fi
PSQL="$PGBIN/psql"
[ -x "$PSQL" ] || PSQL="$(command -v psql)" || han_die "psql not found (install postgresql-client)"

# pg_write_hba: who may connect, rewritten before every start (so a cluster
# an older dev.sh made with trust over TCP is closed too). 127.0.0.1 is
# reachable by every account on the machine and a TCP connection carries no
# OS identity: there the password is required. The unix socket is in
# $PGBASE, mode 700, which only this account (and root) enters: there the
# tools of dev.sh connect without one.
pg_write_hba() {
	cat >"$PGDATA/pg_hba.conf" <<'EOT' || han_die "cannot write pg_hba.conf in $PGDATA"
# Written by scripts/dev.sh at every start; edits here are lost.
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  scram-sha-256
host    all       all   ::1/128       scram-sha-256
EOT
}

# pg_set_password: give postgres the password of secrets.env, over the
# socket and on psql's stdin (never in a process's arguments). A cluster an
# older dev.sh made has none yet; a regenerated secrets.env brings a new one.
pg_set_password() {
	"${psql_[@]}" >/dev/null <<EOT || han_die "could not set the password of postgres; see $PGBASE/postgres.log"
SET log_statement = 'none';
ALTER ROLE postgres PASSWORD '$HAN_DEV_PG_PASSWORD';
EOT
}

gw_pid=""
gw2_pid=""
redis_pid=""
build_pid=""
pg_started=0

# stop_pid PID NAME SECONDS: SIGTERM, wait, then SIGKILL.
# shellcheck disable=SC2317 # called from the EXIT trap
stop_pid() {
	local pid="$1" name="$2" secs="$3" i
	[ -n "$pid" ] || return 0
	kill -0 "$pid" 2>/dev/null || {
		wait "$pid" 2>/dev/null || true
		return 0
	}
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		han_log "$name (pid $pid) did not stop in ${secs}s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317 # the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_pid "$build_pid" "go build" 5
	if [ -z "$gw_pid$redis_pid${cluster_pids[*]:-}" ] && [ "$pg_started" != 1 ]; then
		rm -f "$DATA/run/dev.pid"
		exit "$rc"
	fi
	han_log "stopping the stack"
	[ -n "$gw2_pid" ] && kill -TERM "$gw2_pid" 2>/dev/null || true
	stop_pid "$gw_pid" han-gateway 20
	stop_pid "$gw2_pid" "han-gateway (second)" 20
	stop_pid "$redis_pid" redis-server 30
	if [ "$cluster" = 1 ]; then cluster_stop; fi
	if [ "$pg_started" = 1 ]; then
		pg_run "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null 2>&1 ||
			han_log "pg_ctl stop failed; see $PGBASE/postgres.log"
	fi
	rm -f "$DATA/run/gateway.pid" "$DATA/run/gateway-2.pid" "$DATA/run/redis.pid" "$DATA/run/stack.env" "$DATA/run/dev.pid"
	han_log "stopped"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Leftovers of a dev.sh that was killed hard (we hold the lock, so nothing
# else of this repo's can be running): stop them before starting again.
leftover() { # PIDFILE: prints the pid when it still runs as one of ours
	local pid
	[ -s "$1" ] || return 1
	pid="$(cat "$1")"
	[ -d "/proc/$pid" ] || return 1
	case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in
	"$HAN_ROOT/bin/han-gateway"*) ;;
	*redis-server* | *redis-check-*)
		case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in
		"$DATA/redis" | "$DATA/redis-cluster/node-"*) ;;
		*) return 1 ;;
		esac
		;;
	*) return 1 ;;
	esac
	printf '%s\n' "$pid"
}
for f in gateway gateway-2 redis redis-node-1 redis-node-2 redis-node-3 redis-node-4 redis-node-5 redis-node-6; do
	if pid="$(leftover "$DATA/run/$f.pid")"; then
		han_log "stopping leftover $f (pid $pid) from an earlier run"
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$DATA/run/$f.pid"
done
if [ -s "$PGDATA/PG_VERSION" ] && pg_run "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
	han_log "stopping leftover PostgreSQL from an earlier run"
	pg_run "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
fi

# --- secrets (generated once) -------------------------------------------------
SECRETS="$DATA/secrets.env"
(
	umask 077
	[ -f "$SECRETS" ] || printf '# generated by scripts/dev.sh for the local stack only; never reuse elsewhere\n' >"$SECRETS"
	grep -q '^HAN_JWT_DEV_HS256_SECRET=' "$SECRETS" || echo "HAN_JWT_DEV_HS256_SECRET=$(han_random_hex 24)" >>"$SECRETS"
	grep -q '^HAN_HMAC_SECRET=' "$SECRETS" || echo "HAN_HMAC_SECRET=$(han_random_hex 32)" >>"$SECRETS"
	grep -q '^HAN_REDIS_API_PASSWORD=' "$SECRETS" || echo "HAN_REDIS_API_PASSWORD=$(han_random_hex 32)" >>"$SECRETS"
	grep -q '^HAN_DEV_PG_PASSWORD=' "$SECRETS" || echo "HAN_DEV_PG_PASSWORD=$(han_random_hex 32)" >>"$SECRETS"
	if [ "$cluster" = 1 ]; then
		grep -q '^HAN_REDIS_ADMIN_PASSWORD=' "$SECRETS" || echo "HAN_REDIS_ADMIN_PASSWORD=$(han_random_hex 32)" >>"$SECRETS"
	fi
)
chmod 600 "$SECRETS"
set -a
# shellcheck source=/dev/null
. "$SECRETS"
set +a

# --- build ----------------------------------------------------------------------
han_log "building bin/ (go build ./cmd/...)… the first build takes minutes, later ones seconds"
mkdir -p bin
# In the background, so progress shows and Ctrl-C is handled at once.
go build -o bin/ ./cmd/... </dev/null 9>&- &
build_pid=$!
for ((i = 1; ; i++)); do
	kill -0 "$build_pid" 2>/dev/null || break
	sleep 1
	if ((i % 15 == 0)) && kill -0 "$build_pid" 2>/dev/null; then
		han_log "still building… ${i}s (the first build compiles every dependency)"
	fi
done
wait "$build_pid" || han_die "go build failed (if someone is mid-edit, retry in a minute)"
build_pid=""
han_log "built bin/han-gateway, bin/hanctl, bin/han-loadtest"

# --- PostgreSQL -------------------------------------------------------------------
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	rm -rf "$PGDATA"
	han_log "initdb $PGDATA"
	# The password reaches initdb in a file only the cluster's owner reads,
	# never in its arguments (ps shows those to every account).
	(
		umask 077
		printf '%s\n' "$HAN_DEV_PG_PASSWORD" >"$PGBASE/initdb.pw"
	)
	[ "$is_root" = 1 ] && chown postgres: "$PGBASE/initdb.pw"
	pg_run "$PGBIN/initdb" -D "$PGDATA" --auth-local=trust --auth-host=scram-sha-256 --pwfile="$PGBASE/initdb.pw" \
		-U postgres -E UTF8 --locale=C >"$DATA/logs/initdb.log" 2>&1 || {
		rm -f "$PGBASE/initdb.pw"
		han_die "initdb failed: $(tail -n 5 "$DATA/logs/initdb.log")"
	}
	rm -f "$PGBASE/initdb.pw"
fi
pg_write_hba
# attempt_port N PORT: the port for start attempt N of a server: PORT (or a
# free one when it is busy) first, then any free port, since the one tried
# was taken between the pick and the server's bind.
attempt_port() {
	if [ "$1" = 1 ]; then han_pick_port "$2"; else han_pick_port 0; fi
}
pg_port=""
for attempt in 1 2 3 4 5; do
	pg_port="$(attempt_port "$attempt" "${HAN_DEV_PG_PORT:-55432}")"
	if pg_run "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGBASE/postgres.log" -w -t 60 \
		-o "-p $pg_port -k $PGBASE -c listen_addresses=127.0.0.1" start >/dev/null 2>&1; then
		pg_started=1
		break
	fi
	han_log "PostgreSQL did not start on port $pg_port: $(tail -n 3 "$PGBASE/postgres.log" 2>/dev/null | tr '\n' ' ')"
done
[ "$pg_started" = 1 ] || han_die "could not start PostgreSQL; see $PGBASE/postgres.log"
han_log "PostgreSQL on 127.0.0.1:$pg_port ($PGDATA)"
# Over the unix socket: the one way in without the password.
psql_=("$PSQL" -X -q -w -h "$PGBASE" -p "$pg_port" -U postgres -d postgres -v ON_ERROR_STOP=1)
pg_set_password
if [ "$("${psql_[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'han'")" != 1 ]; then
	"${psql_[@]}" -c 'CREATE DATABASE han' || han_die "CREATE DATABASE han failed"
	han_log "created database han"
fi
# The password is hex: nothing in it needs escaping in a URL.
export DATABASE_URL="postgres://postgres:$HAN_DEV_PG_PASSWORD@127.0.0.1:$pg_port/han?sslmode=disable"

# --- Redis ------------------------------------------------------------------------
if [ "$cluster" = 1 ]; then
	cluster_start
	export REDIS_URL="$REDIS_CLUSTER_URL"
	export REDIS_REALTIME_URL="$REDIS_CLUSTER_URL"
else
	bin/hanctl redis acl --out "$DATA/redis/users.acl" || han_die "hanctl redis acl failed"

	redis_ping() { # AUTH as api_backend and PING over the RESP inline protocol
		(
			exec 3<>"/dev/tcp/127.0.0.1/$redis_port" || exit 1
			printf 'AUTH api_backend %s\r\nPING\r\n' "$HAN_REDIS_API_PASSWORD" >&3
			read -r -t 2 a <&3 && read -r -t 2 b <&3 || exit 1
			[[ "$a" == +OK* && "$b" == +PONG* ]]
		) 2>/dev/null
	}
	# The port is free when picked but another process may take it before
	# redis-server binds it: then it exits at once, and a new port is tried
	# (as for PostgreSQL above).
	redis_up=""
	for attempt in 1 2 3 4 5; do
		redis_port="$(attempt_port "$attempt" "${HAN_DEV_REDIS_PORT:-56379}")"
		redis-server --port "$redis_port" --bind 127.0.0.1 --aclfile "$DATA/redis/users.acl" --dir "$DATA/redis" \
			--appendonly yes --appendfsync everysec --maxmemory-policy volatile-lru --daemonize no \
			--logfile "$DATA/logs/redis.log" </dev/null >/dev/null 2>&1 9>&- &
		redis_pid=$!
		echo "$redis_pid" >"$DATA/run/redis.pid"
		for _ in $(seq 1 300); do
			redis_ping && redis_up=1 && break
			kill -0 "$redis_pid" 2>/dev/null || break
			sleep 0.2
		done
		[ -n "$redis_up" ] && break
		if kill -0 "$redis_pid" 2>/dev/null; then
			han_die "redis-server on 127.0.0.1:$redis_port not answering as api_backend; see .data/logs/redis.log"
		fi
		han_log "redis-server did not start on port $redis_port: $(tail -n 2 "$DATA/logs/redis.log" 2>/dev/null | tr '\n' ' ')"
	done
	[ -n "$redis_up" ] || han_die "could not start redis-server; see .data/logs/redis.log"
	export REDIS_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/0"
	export REDIS_REALTIME_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/1"
	han_log "redis-server on 127.0.0.1:$redis_port (pid $redis_pid, ACL .data/redis/users.acl)"
fi

# --- schema and demo data ---------------------------------------------------------
export HAN_ENV="${HAN_ENV:-dev}"
token_ttl="${HAN_DEV_TOKEN_TTL:-1h}"
bin/hanctl migrate || han_die "hanctl migrate failed"
(
	umask 077
	bin/hanctl seed demo --ttl "$token_ttl" >"$DATA/demo.json.tmp"
) || han_die "hanctl seed demo failed"
mv "$DATA/demo.json.tmp" "$DATA/demo.json"

# demo_get KEY: a value from demo.json (users.alice, tokens.bob, dialogId, ...).
demo_get() {
	awk '
	/^  "[^"]+": \{/ { s = $0; sub(/^  "/, "", s); sub(/".*/, "", s); next }
	/^  \}/ { s = ""; next }
	/^ +"[^"]+": "/ { k = $0; sub(/^ +"/, "", k); sub(/".*/, "", k)
		v = $0; sub(/^[^:]*: "/, "", v); sub(/",?[[:space:]]*$/, "", v)
		print (s == "" ? k : s "." k) "=" v }' "$DATA/demo.json" | sed -n "s/^$1=//p" | sed -n 1p
}
alice_id="$(demo_get users.alice)"
bob_id="$(demo_get users.bob)"
alice_tok="$(demo_get tokens.alice)"
bob_tok="$(demo_get tokens.bob)"
dialog_id="$(demo_get dialogId)"
project_id="$(demo_get projectId)"
if [ -z "$alice_tok" ] || [ -z "$bob_tok" ] || [ -z "$dialog_id" ]; then
	han_die "unexpected output of hanctl seed demo (.data/demo.json)"
fi

# --- gateway ----------------------------------------------------------------------
addr="${HAN_HTTP_ADDR:-127.0.0.1:8080}"
gw_host="${addr%:*}"
gw_port="${addr##*:}"
[ "$gw_host" = "$addr" ] && gw_host="127.0.0.1"
case "$gw_host" in "" | 0.0.0.0 | "[::]" | "::") url_host=127.0.0.1 ;; *) url_host="$gw_host" ;; esac
if [ "$gw_port" = 0 ]; then
	gw_port="$(han_pick_port 0)"
elif han_port_busy "$gw_port"; then
	new_port="$(han_pick_port 0)"
	han_log "port $gw_port is busy; the gateway uses $new_port"
	gw_port="$new_port"
fi
export HAN_HTTP_ADDR="$gw_host:$gw_port"
export HAN_DRAIN_DELAY="${HAN_DRAIN_DELAY:-0}"
# Attachments next to the rest of the stack's state, kept across restarts.
export HAN_BLOB_DIR="${HAN_BLOB_DIR:-$DATA/blobs}"
user_origins="${HAN_ALLOWED_ORIGINS:-}"
# origins_of PORT: the allowed browser origins of a gateway on PORT.
origins_of() {
	local b="http://$url_host:$1"
	case "$url_host" in
	127.0.0.1) b="$b,http://localhost:$1" ;;
	localhost) b="$b,http://127.0.0.1:$1" ;;
	esac
	printf '%s' "$b"
}
# gateway_addrs: HAN_HTTP_ADDR, BASE, the second gateway's port and BASE2
# (cluster), and the allowed origins, for gw_port.
gateway_addrs() {
	export HAN_HTTP_ADDR="$gw_host:$gw_port"
	BASE="http://$url_host:$gw_port"
	BASE2=""
	if [ "$cluster" = 1 ]; then
		# The second gateway: the first one's port + 1 when free.
		gw2_port="$(han_pick_port $((gw_port + 1)))"
		[ "$gw2_port" = "$gw_port" ] && gw2_port="$(han_pick_port 0)"
		BASE2="http://$url_host:$gw2_port"
	fi
	HAN_ALLOWED_ORIGINS="$user_origins"
	if [ -z "$HAN_ALLOWED_ORIGINS" ]; then
		HAN_ALLOWED_ORIGINS="$(origins_of "$gw_port")"
		[ -n "$BASE2" ] && HAN_ALLOWED_ORIGINS="$HAN_ALLOWED_ORIGINS,$(origins_of "$gw2_port")"
	fi
	export HAN_ALLOWED_ORIGINS
}

CURL=(curl -sS --noproxy '*' --max-time 10)
# gateway_ready PID BASE LOG: wait for BASE/readyz (60 s). Returns 1 when
# the gateway exited because its port was taken meanwhile.
gateway_ready() {
	local pid="$1" base="$2" log="$3" ready=""
	for _ in $(seq 1 120); do
		if ! kill -0 "$pid" 2>/dev/null; then
			grep -q 'address already in use' "$log" && return 1
			han_die "han-gateway exited: $(tail -n 10 "$log")"
		fi
		ready="$("${CURL[@]}" --max-time 2 "$base/readyz" 2>/dev/null || true)"
		case "$ready" in *'"status":"ok"'*) return 0 ;; esac
		sleep 0.5
	done
	han_die "han-gateway not ready after 60s: ${ready:-no answer}; see ${log#"$HAN_ROOT/"}"
}

# The gateway(s); a port found free can be taken before the gateway binds
# it: then every gateway starts again on free ports.
for attempt in 1 2 3; do
	gateway_addrs
	: >"$DATA/logs/gateway.log"
	bin/han-gateway </dev/null >>"$DATA/logs/gateway.log" 2>&1 9>&- &
	gw_pid=$!
	echo "$gw_pid" >"$DATA/run/gateway.pid"
	if gateway_ready "$gw_pid" "$BASE" "$DATA/logs/gateway.log"; then
		[ -z "$BASE2" ] && break
		: >"$DATA/logs/gateway-2.log"
		HAN_HTTP_ADDR="$gw_host:$gw2_port" bin/han-gateway </dev/null >>"$DATA/logs/gateway-2.log" 2>&1 9>&- &
		gw2_pid=$!
		echo "$gw2_pid" >"$DATA/run/gateway-2.pid"
		if gateway_ready "$gw2_pid" "$BASE2" "$DATA/logs/gateway-2.log"; then
			han_log "two gateways on one Redis Cluster: $BASE and $BASE2"
			break
		fi
		stop_pid "$gw2_pid" "han-gateway (second)" 20
		gw2_pid=""
	fi
	stop_pid "$gw_pid" han-gateway 20
	gw_pid=""
	[ "$attempt" = 3 ] && han_die "han-gateway: no free port after 3 attempts; see .data/logs/"
	new_port="$(han_pick_port 0)"
	han_log "a gateway port was taken meanwhile; the gateway uses $new_port"
	gw_port="$new_port"
done

if [ "$check" = 1 ]; then
	# On a cluster stack the message is read back through the other gateway.
	read_base="$BASE"
	[ -n "$BASE2" ] && read_base="$BASE2"
	han_log "ready at $BASE; round trip: POST as alice, read back as bob${BASE2:+ at $BASE2}"
	out="$("${CURL[@]}" -w '\n%{http_code}' -X POST "$BASE/v1/dialogs/$dialog_id/messages" \
		-H "Authorization: Bearer $alice_tok" -H 'Content-Type: application/json' \
		-H "Idempotency-Key: dev-check-$$-$(date +%s%N)" \
		-d '{"body":"hello from dev.sh"}')" || han_die "POST failed"
	code="${out##*$'\n'}"
	body="${out%$'\n'*}"
	echo "POST /v1/dialogs/$dialog_id/messages -> $code $body"
	[ "$code" = 201 ] || han_die "round trip FAILED: POST answered $code"
	msg_id="$(printf '%s' "$body" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')"
	seq_="$(printf '%s' "$body" | sed -n 's/.*"seq":\([0-9]*\).*/\1/p')"
	if [ -z "$msg_id" ] || [ -z "$seq_" ]; then
		han_die "round trip FAILED: no id/seq in the POST answer"
	fi
	after=$((seq_ - 1))
	out="$("${CURL[@]}" -w '\n%{http_code}' "$read_base/v1/dialogs/$dialog_id/messages?afterSeq=$after" \
		-H "Authorization: Bearer $bob_tok")" || han_die "GET failed"
	code="${out##*$'\n'}"
	body="${out%$'\n'*}"
	echo "GET /v1/dialogs/$dialog_id/messages?afterSeq=$after -> $code $body"
	web="$("${CURL[@]}" -w '%{http_code}' -o /dev/null "$BASE/" || true)"
	echo "GET / (web client) -> $web"
	if [ "$code" = 200 ] && [[ "$body" == *"\"id\":\"$msg_id\""* ]] && [[ "$body" == *'"body":"hello from dev.sh"'* ]] && [ "$web" = 200 ]; then
		if [ -n "$BASE2" ]; then
			cluster_socket_check "$BASE" "$BASE2" || exit 1
			echo "dev.sh --check: OK (message $msg_id seq $seq_ posted at $BASE, read back at $BASE2; sockets on each gateway got the messages sent through the other)"
			exit 0
		fi
		echo "dev.sh --check: OK (message $msg_id seq $seq_ stored and read back at $BASE)"
		exit 0
	fi
	echo "dev.sh --check: FAILED (message $msg_id not read back)"
	exit 1
fi

# stack_lines: the Redis and log lines of the banner.
stack_lines() {
	if [ "$cluster" = 1 ]; then
		cat <<EOT
  gateway 2    $BASE2/   (same API; both on one Redis Cluster)
  Redis        Cluster 127.0.0.1:${cluster_ports[*]} (3 masters + 3 replicas, created afresh each start),
               user api_backend (HAN_REDIS_API_PASSWORD), admin han_admin (HAN_REDIS_ADMIN_PASSWORD) in .data/secrets.env
  logs         .data/logs/gateway.log  .data/logs/gateway-2.log  .data/logs/redis-node-*.log  $PGBASE/postgres.log
EOT
		return
	fi
	cat <<EOT
  Redis        127.0.0.1:$redis_port, user api_backend (password: HAN_REDIS_API_PASSWORD in .data/secrets.env)
  logs         .data/logs/gateway.log  .data/logs/redis.log  $PGBASE/postgres.log
EOT
}

# The running stack's addresses for scripts that drive it
# (scripts/loadtest-smoke.sh); removed when the stack stops.
(
	umask 077
	printf "HAN_BASE_URL='%s'\nDATABASE_URL='%s'\nREDIS_URL='%s'\nREDIS_REALTIME_URL='%s'\nHAN_ENV='%s'\n" \
		"$BASE" "$DATABASE_URL" "$REDIS_URL" "$REDIS_REALTIME_URL" "$HAN_ENV" >"$DATA/run/stack.env.tmp"
	if [ -n "$BASE2" ]; then
		printf "HAN_BASE_URL_2='%s'\nHAN_BASE_URLS='%s'\n" "$BASE2" "$BASE,$BASE2" >>"$DATA/run/stack.env.tmp"
	fi
	mv "$DATA/run/stack.env.tmp" "$DATA/run/stack.env"
)

cat <<EOF

HAN dev stack is up
  web client   $BASE/
  API          $BASE/v1   (health: $BASE/healthz  $BASE/readyz  $BASE/metrics)
  PostgreSQL   127.0.0.1:$pg_port, database han, user postgres (password: HAN_DEV_PG_PASSWORD in .data/secrets.env;
               the whole URL is DATABASE_URL of scripts/dev.sh --env; data $PGDATA)
$(stack_lines)

Demo data (also in .data/demo.json; tokens valid $token_ttl (HAN_DEV_TOKEN_TTL), fresh ones below):
  alice    $alice_id
  bob      $bob_id
  dialog   $dialog_id
  project  $project_id
  alice token  $alice_tok
  bob token    $bob_tok

Sign-in links for the web client (the token is in the URL fragment, which is never sent to the
server; the client keeps it per tab, so open the two in two tabs to chat as both):
  alice        $BASE/#token=$alice_tok&project=$project_id
  bob          $BASE/#token=$bob_tok
A link names its user and signs the tab in only once you confirm. When a token runs out the tab
asks for a new one: mint it (or a fresh link) from another shell in $HAN_ROOT:
  eval "\$(scripts/dev.sh --env)"
  bin/hanctl token --sub $alice_id --ttl $token_ttl   # a token for alice
  echo "\$HAN_BASE_URL/#token=\$(bin/hanctl token --sub $bob_id --ttl $token_ttl)"   # a sign-in link for bob

Try it from another shell in $HAN_ROOT (README, "Try it by hand"):
  eval "\$(scripts/dev.sh --env)"     # HAN_BASE_URL, DATABASE_URL, REDIS_URL, dev secrets: hanctl works too
  TOKEN=\$(jq -r .tokens.alice .data/demo.json)
  DIALOG=\$(jq -r .dialogId .data/demo.json)
  curl -sS -X POST "\$HAN_BASE_URL/v1/dialogs/\$DIALOG/messages" -H "Authorization: Bearer \$TOKEN" \\
       -H "Idempotency-Key: \$(date +%s%N)" -H 'Content-Type: application/json' -d '{"body":"hello"}'
  curl -sS "\$HAN_BASE_URL/v1/dialogs/\$DIALOG/messages?afterSeq=0" -H "Authorization: Bearer \$TOKEN"

Ctrl-C (or scripts/dev.sh --stop from another shell) stops the gateway, redis-server and PostgreSQL
(data stays in $DATA).
EOF

# Run until Ctrl-C / SIGTERM (the traps stop everything) or a process dies.
set +e
if [ "$cluster" = 1 ]; then
	wait -n "$gw_pid" "$gw2_pid" "${cluster_pids[@]}"
else
	wait -n "$gw_pid" "$redis_pid"
fi
rc=$?
set -e
if ! kill -0 "$gw_pid" 2>/dev/null; then
	han_log "han-gateway exited (status $rc): $(tail -n 5 "$DATA/logs/gateway.log")"
elif [ -n "$gw2_pid" ] && ! kill -0 "$gw2_pid" 2>/dev/null; then
	han_log "the second han-gateway exited (status $rc): $(tail -n 5 "$DATA/logs/gateway-2.log")"
elif [ "$cluster" = 1 ]; then
	han_log "a Redis Cluster node exited (status $rc); see $DATA/logs/redis-node-*.log"
else
	han_log "redis-server exited (status $rc): $(tail -n 5 "$DATA/logs/redis.log")"
fi
exit 1
