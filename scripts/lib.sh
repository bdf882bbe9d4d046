# shellcheck shell=bash
# Shared helpers for scripts/dev.sh, scripts/test.sh and .ci/run.
# Source it; it defines functions and HAN_ROOT (the repository root) only.

HAN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
HAN_SCRIPT="${HAN_SCRIPT:-$(basename "$0")}"

han_log() { printf '%s: %s\n' "$HAN_SCRIPT" "$*" >&2; }
han_die() { printf '%s: error: %s\n' "$HAN_SCRIPT" "$*" >&2; exit 1; }

# han_as_root CMD...: run CMD as root (directly when root, else via sudo).
han_as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo "$@"
	else
		han_die "need root (or sudo) to run: $*"
	fi
}

# han_pg_bindir prints the directory holding initdb and pg_ctl: PATH first,
# then the newest Debian layout /usr/lib/postgresql/<version>/bin.
han_pg_bindir() {
	local p d
	if p="$(command -v pg_ctl 2>/dev/null)" && command -v initdb >/dev/null 2>&1; then
		p="$(readlink -f "$p")"
		dirname "$p"
		return 0
	fi
	d="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -type d -name bin 2>/dev/null | sort -t/ -k4,4V | tail -n 1)"
	if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
		printf '%s\n' "$d"
		return 0
	fi
	return 1
}

# han_ensure_packages [--curl] [--cc] [--make] [--chromium] [--promtool] [--jq] [--pgbouncer] [--systemd] [--node]:
# installs, from the OS packages, redis-server and PostgreSQL when missing,
# plus curl / a C compiler (go test -race needs cgo) / make / headless
# Chromium with a font (the web client's browser tests) / promtool (Debian
# package prometheus: the alert-rule tests) / jq (the README's walk-through)
# / pgbouncer (the tests behind a transaction-pooling proxy) / systemd-analyze
# (the unit file's hardening score) / node and npm (the JavaScript SDK's
# type check and tests) when asked for and missing.
han_ensure_packages() {
	local pkgs=() want_curl=0 want_cc=0 want_make=0 want_chromium=0 want_promtool=0 want_jq=0 want_pgbouncer=0 want_systemd=0 want_node=0 a
	for a in "$@"; do
		case "$a" in
		--pgbouncer) want_pgbouncer=1 ;;
		--systemd) want_systemd=1 ;;
		--node) want_node=1 ;;
		--curl) want_curl=1 ;;
		--cc) want_cc=1 ;;
		--make) want_make=1 ;;
		--chromium) want_chromium=1 ;;
		--promtool) want_promtool=1 ;;
		--jq) want_jq=1 ;;
		esac
	done
	command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || pkgs+=(redis-server)
	han_pg_bindir >/dev/null || pkgs+=(postgresql)
	if [ "$want_curl" = 1 ] && ! command -v curl >/dev/null 2>&1; then pkgs+=(curl ca-certificates); fi
	if [ "$want_cc" = 1 ] && ! command -v "$(go env CC 2>/dev/null || echo gcc)" >/dev/null 2>&1; then pkgs+=(gcc libc6-dev); fi
	if [ "$want_make" = 1 ] && ! command -v make >/dev/null 2>&1; then pkgs+=(make); fi
	if [ "$want_chromium" = 1 ] && ! command -v chromium >/dev/null 2>&1; then pkgs+=(chromium fonts-dejavu-core); fi
	if [ "$want_promtool" = 1 ] && ! command -v promtool >/dev/null 2>&1; then pkgs+=(prometheus); fi
	if [ "$want_jq" = 1 ] && ! command -v jq >/dev/null 2>&1; then pkgs+=(jq); fi
	if [ "$want_pgbouncer" = 1 ] && ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then pkgs+=(pgbouncer); fi
	if [ "$want_systemd" = 1 ] && ! command -v systemd-analyze >/dev/null 2>&1; then pkgs+=(systemd); fi
	if [ "$want_node" = 1 ] && ! command -v node >/dev/null 2>&1; then pkgs+=(nodejs); fi
	if [ "$want_node" = 1 ] && ! command -v npm >/dev/null 2>&1; then pkgs+=(npm); fi
	if [ "${#pkgs[@]}" -eq 0 ]; then
		[ "$want_node" = 1 ] && han_check_node
		return 0
	fi
	command -v apt-get >/dev/null 2>&1 || han_die "missing ${pkgs[*]} and no apt-get to install them; install them by hand"
	han_log "installing missing OS packages: ${pkgs[*]}"
	han_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 ||
		han_die "apt-get update failed"
	han_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" </dev/null >&2 ||
		han_die "apt-get install ${pkgs[*]} failed"
	han_pg_bindir >/dev/null || han_die "PostgreSQL binaries (initdb, pg_ctl) still not found after installing"
	command -v redis-server >/dev/null 2>&1 || han_die "redis-server still not found after installing"
	if [ "$want_pgbouncer" = 1 ] && ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
		han_die "pgbouncer still not found after installing"
	fi
	[ "$want_node" = 1 ] && han_check_node
	return 0
}

# han_check_node: the SDK's Node tests need Node.js 20.11 or later (node
# --test-timeout, mock timers of Date); an older one (Debian 12 ships 18)
# stops here with what to do, instead of failing inside the tests.
han_check_node() {
	local v
	v=$(node -p 'process.versions.node' 2>/dev/null) || han_die "node not found after installing nodejs"
	node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 11) ? 0 : 1)' ||
		han_die "Node.js $v is too old: the SDK tests need 20.11 or later (Debian 12's nodejs is 18); install Node.js 20 (for example NodeSource's nodejs package) and run again"
}

# han_sdk_deps: installs the pinned npm packages of the JavaScript SDK
# (web/sdk/package-lock.json: TypeScript for the type check, ws for the Node
# tests) and of the browser tests' accessibility checks
# (cmd/han-gateway/testdata/axe: axe-core) with `npm ci` where node_modules
# is missing.
han_sdk_deps() {
	local d
	for d in web/sdk cmd/han-gateway/testdata/axe; do
		[ -d "$HAN_ROOT/$d/node_modules" ] && continue
		command -v npm >/dev/null 2>&1 || han_die "npm not found: install Node.js 20+ with npm (the SDK's type check and tests, and the browser tests' axe-core, need it)"
		han_log "npm ci in $d (its node_modules is missing)"
		(cd "$HAN_ROOT/$d" && npm ci --no-audit --no-fund </dev/null >&2) || han_die "npm ci in $d failed"
	done
}

# han_port_busy PORT: true when something accepts TCP connections on
# 127.0.0.1:PORT (a listener on 0.0.0.0 or ::, too).
han_port_busy() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# han_pick_port [PREFERRED]: prints PREFERRED when free, else (or when
# PREFERRED is empty or 0) a free port found by probing random ports from
# 20000 up to the kernel's ephemeral range (net.ipv4.ip_local_port_range,
# usually from 32768): a port in that range that looks free may be handed
# to an outgoing connection before our server binds it.
han_pick_port() {
	local p="${1:-0}" lo=32768 span
	if [ "$p" != 0 ] && ! han_port_busy "$p"; then
		printf '%s\n' "$p"
		return 0
	fi
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
	span=$((lo - 20000))
	[ "$span" -ge 2000 ] || span=12768
	for _ in $(seq 1 200); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % span))
		case "$p" in 5432 | 6379) continue ;; esac
		if ! han_port_busy "$p"; then
			printf '%s\n' "$p"
			return 0
		fi
	done
	han_die "no free TCP port found on 127.0.0.1"
}

# han_random_hex N: N random bytes as 2N lowercase hex characters.
han_random_hex() {
	od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'
}

# han_psql PSQL URL ARGS...: run the psql binary PSQL on the PostgreSQL URL
# with ARGS; the URL's password (URL-encoded) goes to psql in PGPASSWORD,
# never in its arguments, which ps shows to every account.
han_psql() {
	local psql=$1 url=$2 pw="" re='^(postgres(ql)?://[^:@/]*):([^@/]*)@(.*)$'
	shift 2
	if [[ "$url" =~ $re ]]; then
		url="${BASH_REMATCH[1]}@${BASH_REMATCH[4]}"
		pw="${BASH_REMATCH[3]}"
		pw="$(printf '%b' "${pw//%/\\x}")"
	fi
	PGPASSWORD="$pw" "$psql" -d "$url" "$@"
}

# han_hash STRING: a short stable hash (12 hex chars).
han_hash() {
	printf '%s' "$1" | sha256sum | cut -c1-12
}

# han_gofmt_unformatted: lists unformatted .go files of the module (skips
# .git, .data, bin and testdata folders).
han_gofmt_unformatted() {
	(cd "$HAN_ROOT" && find . \( -name .git -o -name .data -o -name bin -o -name testdata -o -name node_modules \) -prune \
		-o -type f -name '*.go' -print0 | xargs -0 -r gofmt -l)
}

# han_bench_redis NAME HANCTL WORK: for a benchmark's own gateway(s), export
# the dev secrets (prefixed NAME), write the ACL file with HANCTL into WORK,
# start a private redis-server on a free port (no persistence) and wait for
# it; sets redis_port and redis_pid and exports REDIS_URL (DB0) and
# REDIS_REALTIME_URL (DB1) as api_backend. The caller stops redis_pid.
han_bench_redis() {
	local name=$1 hanctl=$2 work=$3
	export HAN_ENV=dev HAN_REDIS_API_PASSWORD="$name-$RANDOM$RANDOM$RANDOM"
	export HAN_JWT_DEV_HS256_SECRET="$name-secret-$RANDOM$RANDOM-0123456789abcdef" HAN_HMAC_SECRET="$name-hmac-0123456789"
	"$hanctl" redis acl --out "$work/users.acl" >/dev/null
	redis_port="$(han_pick_port 0)"
	redis-server --port "$redis_port" --bind 127.0.0.1 --aclfile "$work/users.acl" --dir "$work" --save '' \
		--appendonly no --daemonize no --logfile "$work/redis.log" </dev/null >/dev/null 2>&1 &
	redis_pid=$!
	for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break; sleep 0.1; done
	export REDIS_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/0"
	export REDIS_REALTIME_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:$redis_port/1"
}

# han_redis_cmdstats PORT PASSWORD: a benchmark's view of its own redis-server
# through the user bench_stats (ACL "-@all +info", PASSWORD): one "cmd calls
# usec" line per command (INFO commandstats; Redis 7 counts the commands a
# script calls too) and "_reads N 0", the reads its event loop made (each a
# pipeline or lone command that woke it; "_reads" is no command name). The
# delta of two reads shows what a phase asked of Redis.
han_redis_cmdstats() {
	local cli=(redis-cli -p "$1" --user bench_stats --pass "$2" --no-auth-warning)
	"${cli[@]}" INFO commandstats | tr -d '\r' |
		sed -n 's/^cmdstat_\([^:]*\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2 \3/p'
	"${cli[@]}" INFO stats | tr -d '\r' | sed -n 's/^total_reads_processed:\([0-9]*\)$/_reads \1 0/p'
}

# han_steal_ticks: the machine's stolen and total CPU ticks so far
# (/proc/stat): a hypervisor that takes the CPUs away shows up here, not in
# any process. han_steal_pct S0 T0 S1 T1: the stolen share between two reads.
han_steal_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $9, t; exit }' /proc/stat; }
han_steal_pct() { awk -v s=$(($3 - $1)) -v t=$(($4 - $2)) 'BEGIN { printf "%.0f", (t > 0 ? 100 * s / t : 0) }'; }
