# shellcheck shell=bash
# The Redis Cluster of `scripts/dev.sh --cluster`: six redis-server
# processes on loopback (3 masters, each with one replica), every node
# loaded with the cluster ACL (`hanctl redis acl --cluster`) plus an admin
# user, han_admin, that creates the cluster and that replicas authenticate
# as (the gateways connect as api_backend). Sourced by dev.sh, which
# provides DATA, HAN_REDIS_API_PASSWORD, HAN_REDIS_ADMIN_PASSWORD, han_log,
# han_die and han_pick_port.
#
# State: $DATA/redis-cluster/users.acl (shared by the nodes) and
# node-1 … node-6 (each node's nodes.conf, AOF); logs in
# $DATA/logs/redis-node-<n>.log; pids in $DATA/run/redis-node-<n>.pid.
# The cluster is created afresh on every start (PostgreSQL keeps the data;
# presence, caches and the project Redis API's data start empty).

CLUSTER_ADMIN_USER=han_admin
CLUSTER_NODES=6
CLUSTER_DIR="$DATA/redis-cluster"
cluster_ports=()    # client port of node n at index n-1
cluster_pids=()     # pid of node n at index n-1

# cluster_cli PORT ARGS...: redis-cli as the admin user against one node;
# the password goes through the environment, never the command line.
cluster_cli() {
	local port="$1"
	shift
	REDISCLI_AUTH="$HAN_REDIS_ADMIN_PASSWORD" redis-cli --no-auth-warning -h 127.0.0.1 -p "$port" \
		--user "$CLUSTER_ADMIN_USER" "$@" </dev/null 2>/dev/null
}

# cluster_start_node N PORT BUSPORT: start node N and wait until it answers.
cluster_start_node() {
	local n="$1" port="$2" bus="$3" dir="$CLUSTER_DIR/node-$1" pid
	rm -rf "$dir"
	mkdir -p "$dir"
	chmod 700 "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --aclfile "$CLUSTER_DIR/users.acl" \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" --cluster-node-timeout 5000 \
		--masteruser "$CLUSTER_ADMIN_USER" --masterauth "$HAN_REDIS_ADMIN_PASSWORD" \
		--repl-diskless-sync-delay 0 --repl-ping-replica-period 1 --appendonly yes --appendfsync everysec --maxmemory-policy volatile-lru \
		--daemonize no --logfile "$DATA/logs/redis-node-$n.log" </dev/null >/dev/null 2>&1 9>&- &
	pid=$!
	cluster_pids[n - 1]=$pid
	cluster_ports[n - 1]=$port
	echo "$pid" >"$DATA/run/redis-node-$n.pid"
	for _ in $(seq 1 100); do
		[ "$(cluster_cli "$port" ping)" = PONG ] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# cluster_healthy: every node sees the whole slot map served (three
# masters, six nodes), every replica's link to its master is up and every
# node's CLUSTER SLOTS lists all six.
cluster_healthy() {
	local port info
	for port in "${cluster_ports[@]}"; do
		info="$(cluster_cli "$port" cluster info)" || return 1
		[[ "$info" == *cluster_state:ok* && "$info" == *cluster_known_nodes:$CLUSTER_NODES* && "$info" == *cluster_size:3* ]] || return 1
		info="$(cluster_cli "$port" info replication)" || return 1
		[[ "$info" == *role:master* || "$info" == *master_link_status:up* ]] || return 1
	done
	[ "$(cluster_cli "${cluster_ports[0]}" cluster nodes | grep -c 'slave')" = 3 ] || return 1
	# Clients read the slot map from CLUSTER SLOTS, which lists a replica
	# only once its replication offset moved (a replica ping does that:
	# every second here, not the default 10 s).
	for port in "${cluster_ports[@]}"; do
		[ "$(cluster_cli "$port" cluster slots | grep -c '^127\.0\.0\.1$')" = "$CLUSTER_NODES" ] || return 1
	done
}

# cluster_start: render the ACL, start the six nodes on the preferred
# ports (HAN_DEV_REDIS_PORT and the five after it, cluster bus +1000) or
# free ones, create the cluster and wait until it is healthy. Sets
# REDIS_CLUSTER_URL (api_backend's cluster URL: the first node as host,
# the others as addr= entries).
cluster_start() {
	local base="${HAN_DEV_REDIS_PORT:-57001}" n port bus want attempt nodes=""
	command -v redis-cli >/dev/null 2>&1 || han_die "redis-cli not found (install the redis-tools package)"
	mkdir -p "$CLUSTER_DIR"
	chmod 700 "$CLUSTER_DIR"
	# The admin user: its password from HAN_REDIS_ADMIN_PASSWORD (exported).
	bin/hanctl redis acl --cluster --admin-user "$CLUSTER_ADMIN_USER" --out "$CLUSTER_DIR/users.acl" >/dev/null ||
		han_die "hanctl redis acl --cluster failed"
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		# A port found free can be taken before the node binds it: then
		# retry on free ones.
		for attempt in 1 2 3 4 5; do
			want=0
			[ "$base" != 0 ] && [ "$attempt" = 1 ] && want=$((base + n - 1))
			port="$(han_pick_port "$want")"
			want=0
			[ "$base" != 0 ] && [ "$attempt" = 1 ] && want=$((port + 1000))
			bus="$(han_pick_port "$want")"
			[ "$bus" = "$port" ] && bus="$(han_pick_port 0)"
			cluster_start_node "$n" "$port" "$bus" && continue 2
			stop_pid "${cluster_pids[n - 1]}" "redis-server (cluster node $n)" 5
			han_log "cluster node $n did not start on ports $port/$bus: $(tail -n 1 "$DATA/logs/redis-node-$n.log" 2>/dev/null)"
		done
		han_die "redis-server (cluster node $n) did not start; see $DATA/logs/redis-node-$n.log"
	done
	han_log "6 redis-server nodes on 127.0.0.1:${cluster_ports[*]}; creating the cluster (3 masters, 3 replicas)"
	local addrs=()
	for port in "${cluster_ports[@]}"; do addrs+=("127.0.0.1:$port"); done
	REDISCLI_AUTH="$HAN_REDIS_ADMIN_PASSWORD" redis-cli --no-auth-warning --user "$CLUSTER_ADMIN_USER" \
		--cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes </dev/null >"$DATA/logs/redis-cluster-create.log" 2>&1 ||
		han_die "redis-cli --cluster create failed: $(tail -n 5 "$DATA/logs/redis-cluster-create.log")"
	for _ in $(seq 1 300); do
		cluster_healthy && break
		sleep 0.2
	done
	cluster_healthy || han_die "the Redis Cluster did not become healthy in 60s; see $DATA/logs/redis-node-*.log"
	for port in "${cluster_ports[@]:1}"; do nodes+="${nodes:+&}addr=127.0.0.1:$port"; done
	REDIS_CLUSTER_URL="redis://api_backend:$HAN_REDIS_API_PASSWORD@127.0.0.1:${cluster_ports[0]}?$nodes"
	han_log "Redis Cluster ok on 127.0.0.1:${cluster_ports[*]} (ACL $CLUSTER_DIR/users.acl)"
}

# cluster_stop: stop every node dev.sh started (SIGTERM, then SIGKILL).
# shellcheck disable=SC2317 # called from dev.sh's EXIT trap
cluster_stop() {
	local n
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		[ -n "${cluster_pids[n - 1]:-}" ] && kill -TERM "${cluster_pids[n - 1]}" 2>/dev/null || true
	done
	for ((n = 1; n <= CLUSTER_NODES; n++)); do
		stop_pid "${cluster_pids[n - 1]:-}" "redis-server (cluster node $n)" 30
		rm -f "$DATA/run/redis-node-$n.pid"
	done
}

# cluster_socket_check BASE1 BASE2: two users in one dialog, one socket on
# each gateway, each sending through the gateway its socket is on
# (han-loadtest's chat-fanout over both targets). Every message must reach
# both sockets, so each one crossed from one gateway to the other through
# the cluster's sharded Pub/Sub.
cluster_socket_check() {
	local out="$DATA/logs/check-sockets.json" log="$DATA/logs/check-sockets.log" r sent expected received on1 on2
	han_log "sockets across the gateways: han-loadtest run chat-fanout -target $1,$2"
	if ! bin/han-loadtest run chat-fanout -target "$1,$2" -users 2 -dialogs 1 -rate 4 -duration 2s -drain 10s \
		-threshold 'delivery_lost==0' -threshold 'delivery_duplicates==0' -quiet -summary-export "$out" \
		</dev/null >"$log" 2>&1; then
		echo "dev.sh --check: FAILED: messages did not cross the gateways (see ${log#"$HAN_ROOT/"})"
		tail -n 30 "$log"
		return 1
	fi
	r="$(jq -r --arg a "$1" --arg b "$2" '[.metrics["sends_ok"].values.count // 0,
		.metrics["delivery_expected"].values.count // 0, .metrics["delivery_received"].values.count // 0,
		.metrics["ws_sessions{target=" + $a + "}"].values.count // 0,
		.metrics["ws_sessions{target=" + $b + "}"].values.count // 0] | map(tostring) | join(" ")' "$out")"
	read -r sent expected received on1 on2 <<<"$r"
	echo "sockets: $on1 on $1, $on2 on $2; $sent messages sent, $received of $expected deliveries"
	if [ "$sent" -gt 0 ] && [ "$on1" = 1 ] && [ "$on2" = 1 ] && [ "$expected" = $((2 * sent)) ] && [ "$received" = "$expected" ]; then
		return 0
	fi
	echo "dev.sh --check: FAILED: not every message reached the socket on each gateway (see ${log#"$HAN_ROOT/"})"
	return 1
}
