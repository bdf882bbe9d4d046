#!/usr/bin/env bash
# scripts/loadtest-outage.sh — the outage figures of docs/testing.md: a
# non-race han-gateway on a private redis-server (AOF, the rendered ACL) and
# a private PostgreSQL, chat-fanout at RATE msg/s, Redis SIGKILLed for 5 s
# 7 s into the measured phase (NOKILL=1: the same run without the outage,
# the baseline). Prints the gateway's CPU seconds over the measured phase
# and the load tester's summary. Never touches the shared servers.
#
#   scripts/loadtest-outage.sh                      # RATE=1000 USERS=200 DIALOGS=100 DUR=20s
#   NOKILL=1 scripts/loadtest-outage.sh
#
# The message-send rate limits are raised through runtime settings so the
# REST path, not the limiter, is measured.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh # han_psql: a URL's password reaches psql in its environment, not its arguments
if [[ -z "${HAN_TEST_DATABASE_URL:-}" ]]; then
	exec go run ./internal/testenv/cmd/withpg -- bash "$0" "$@"
fi
W=$(mktemp -d /tmp/han-outage-XXXXXX)
go build -o "$W/han-gateway" ./cmd/han-gateway
go build -o "$W/hanctl" ./cmd/hanctl
go build -o "$W/han-loadtest" ./cmd/han-loadtest
RATE=${RATE:-1000}
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
base=${HAN_TEST_DATABASE_URL%/*}
han_psql psql "$HAN_TEST_DATABASE_URL" -qc 'CREATE DATABASE han_lt' >/dev/null
DB="$base/han_lt"
rp=$(free_port); hp=$(free_port)
pw=api-$RANDOM$RANDOM$RANDOM
rm -rf $W/redis; mkdir -p $W/redis
HAN_REDIS_API_PASSWORD=$pw $W/hanctl redis acl --out $W/redis/users.acl >/dev/null
start_redis() {
  redis-server --port $rp --bind 127.0.0.1 --aclfile $W/redis/users.acl --dir $W/redis --appendonly yes \
    --appendfsync everysec --save "" --maxmemory-policy volatile-lru --daemonize no --logfile $W/redis/redis.log </dev/null >/dev/null 2>&1 &
  echo $! > $W/redis.pid
  for i in $(seq 100); do REDISCLI_AUTH=$pw redis-cli -p $rp --user api_backend ping 2>/dev/null | grep -q PONG && return; sleep 0.05; done
}
start_redis
# errexit applies inside the trap too: a kill of a process already gone
# would end the script with its status (1) after a passing run.
trap 'set +e; kill $(cat $W/redis.pid) 2>/dev/null; [ -n "${gpid:-}" ] && kill $gpid 2>/dev/null; [ -n "${lpid:-}" ] && kill $lpid 2>/dev/null; rm -rf "$W"' EXIT
export DATABASE_URL=$DB HAN_HTTP_ADDR=127.0.0.1:$hp REDIS_URL=redis://api_backend:$pw@127.0.0.1:$rp/0 \
  REDIS_REALTIME_URL=redis://api_backend:$pw@127.0.0.1:$rp/1 HAN_JWT_DEV_HS256_SECRET=lt-secret-0123456789abcdef0123456789 \
  HAN_HMAC_SECRET=lt-hmac-0123456789 HAN_ALLOWED_ORIGINS=http://localhost:8080 HAN_LOG_LEVEL=warn
$W/hanctl migrate >/dev/null
han_psql psql "$DB" -qc "INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES ('POST /v1/dialogs/{id}/messages', 'sliding', 'fail-closed', '[{\"family\":\"user\",\"limit\":1000,\"windowMs\":10000},{\"family\":\"dialog\",\"limit\":1000,\"windowMs\":10000},{\"family\":\"ip\",\"limit\":100000,\"windowMs\":10000}]')"
$W/han-gateway >$W/gateway.log 2>&1 &
gpid=$!
for i in $(seq 200); do curl -fs http://127.0.0.1:$hp/readyz >/dev/null 2>&1 && break; sleep 0.05; done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
tick=$(getconf CLK_TCK)
( $W/han-loadtest run chat-fanout -target http://127.0.0.1:$hp -users ${USERS:-200} -dialogs ${DIALOGS:-100} -rate $RATE \
    -duration ${DUR:-20s} -dev-secret $HAN_JWT_DEV_HS256_SECRET -quiet -summary-export $W/summary.json > $W/loadtest.out 2>&1; echo "loadtest exit $?" >> $W/loadtest.out ) &
lpid=$!
# Wait for the measured phase (the first idempotency record), then 7 s; kill Redis for 5 s.
for i in $(seq 600); do c=$(REDISCLI_AUTH=$pw redis-cli -p $rp --user api_backend --scan --pattern 'han:api:idem:*' 2>/dev/null | head -1 || true); [ -n "$c" ] && break; sleep 0.1; done
kill -0 $gpid || { cat $W/gateway.log; exit 1; }
g0=$(cpu $gpid); t0=$(date +%s.%N)
sleep 7
if [[ -z "${NOKILL:-}" ]]; then kill -9 $(cat $W/redis.pid); echo "redis killed at $(date +%T.%N)"
sleep 5
start_redis; echo "redis back at $(date +%T.%N)"; fi
wait $lpid || true
g1=$(cpu $gpid); t1=$(date +%s.%N)
echo "gateway CPU: $(python3 -c "print(round(($g1-$g0)/$tick,2))") s over $(python3 -c "print(round($t1-$t0,1))") s wall"
kill $gpid; wait $gpid 2>/dev/null || true
kill $(cat $W/redis.pid) 2>/dev/null || true
tail -60 "$W/loadtest.out"
grep -q '^loadtest exit 0$' "$W/loadtest.out"
