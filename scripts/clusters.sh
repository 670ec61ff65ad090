#!/usr/bin/env bash
# Three-node topologies on loopback for warden's cluster fault tests
# (internal/clusters, build tag clusters): a 3-member etcd cluster, a
# 3-server ZooKeeper ensemble, a Redis Cluster of 3 masters with a replica
# each, and a Consul datacenter of 3 servers with a client agent that the
# tests' clients talk to, as applications talk to their node's agent.
#
#   scripts/clusters.sh up           install or build what is missing, start every node, form the clusters
#   scripts/clusters.sh down         stop every node `up` started
#   scripts/clusters.sh status       which nodes answer, and what role they have
#   scripts/clusters.sh env          export lines for the tests: eval "$(scripts/clusters.sh env)"
#   scripts/clusters.sh clean        down, then delete the state directory
#   scripts/clusters.sh start NODE.. start the named nodes (e.g. etcd-17121) again after a kill
#
# etcd and Consul are built from their Go modules by scripts/services.sh,
# once, into its cache directory (WARDEN_CACHE_DIR), and built by it from
# here if they are not there yet; WARDEN_ETCD_BIN and WARDEN_CONSUL_BIN name
# other binaries.
#
# Unlike scripts/services.sh, every node here is ours: the tests kill, stop
# and restart them, so a port already taken by another process is an error,
# never a server to share. The ports are fixed, in 17100-17199 (Redis cluster
# buses at +10000; Consul at 17170-17179 and 17189), below the ephemeral range and away from the shared test
# servers (16379-16384, 12379, 12181, 15432, 13306) and from internal/faults'
# own (17181, 17379-17385, 17432, 17479-17480). Everything a node writes
# lives under WARDEN_CLUSTERS_DIR (default /tmp/warden-clusters), one
# directory per node named <kind>-<client port> (Consul: its HTTP port).
set -Eeuo pipefail

SVC=clusters
say() { printf '%s: %s\n' "$SVC" "$*"; }
warn() { printf '%s: %s\n' "$SVC" "$*" >&2; }
die() {
	warn "$*"
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }
# A failing `return` was already explained by whoever returned.
trap '[[ $BASH_COMMAND == return* ]] || warn "failed (exit $?): $BASH_COMMAND"' ERR

STATE_DIR=${WARDEN_CLUSTERS_DIR:-/tmp/warden-clusters}
# Per node. Three JVMs and a cluster election on a loaded 2-core machine can
# take a minute; failing early would only make CI flaky.
TIMEOUT=${WARDEN_CLUSTERS_TIMEOUT:-180}
LOCK_FILE=${TMPDIR:-/tmp}/warden-clusters.lock

ETCD_CLIENT_PORTS=(17121 17122 17123)
ETCD_PEER_PORTS=(17131 17132 17133)
ZK_CLIENT_PORTS=(17141 17142 17143)
ZK_QUORUM_PORTS=(17151 17152 17153)
ZK_ELECTION_PORTS=(17161 17162 17163)
REDIS_PORTS=(17101 17102 17103 17104 17105 17106)
# Consul servers: HTTP, server RPC (Raft) and Serf LAN ports; the client
# agent: HTTP and Serf LAN. No DNS, gRPC, HTTPS or WAN ports are opened.
CONSUL_HTTP_PORTS=(17171 17172 17173)
CONSUL_SERVER_PORTS=(17174 17175 17176)
CONSUL_SERF_PORTS=(17177 17178 17179)
CONSUL_CLIENT_HTTP_PORT=17170
CONSUL_CLIENT_SERF_PORT=17189
# The tests' failover timing depends on it: a dead master is declared failed
# after this, and its replica promoted within about two more seconds.
REDIS_NODE_TIMEOUT=2000

joined() {
	local sep=$1 out="" p
	shift
	for p in "$@"; do out+="${out:+$sep}127.0.0.1:$p"; done
	printf '%s\n' "$out"
}

# ---------------------------------------------------------------------------
# Installation (as scripts/services.sh does, for Redis and ZooKeeper only)

missing_packages() {
	{ have redis-server && have redis-cli; } || echo redis-server redis-tools
	[[ -f /usr/share/java/zookeeper.jar && -f /usr/share/java/slf4j-log4j12.jar && -f /usr/share/java/log4j-1.2.jar ]] || echo zookeeper
	have java || echo default-jre-headless
	have curl || echo curl
	{ have setsid && have flock; } || echo util-linux
}

install_missing() {
	local pkgs sudo=()
	pkgs=$(missing_packages | xargs)
	[[ -n $pkgs ]] || return 0
	if [[ $EUID -ne 0 ]]; then
		have sudo || die "missing packages ($pkgs), and not root: install them, or run as root"
		sudo=(sudo)
	fi
	say "installing: $pkgs"
	# Post-install scripts would otherwise start system-wide servers on the
	# default ports, or fail where there is no init system.
	local made_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
		"${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
		made_policy=1
	fi
	local rc=0
	# shellcheck disable=SC2086 # $pkgs is a list of words
	{
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update &&
			"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
				--no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $pkgs
	} || rc=$?
	[[ -z $made_policy ]] || "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
	[[ $rc -eq 0 ]] || die "apt-get failed (exit $rc) installing: $pkgs"
	pkgs=$(missing_packages | xargs)
	[[ -z $pkgs ]] || die "still missing after apt-get install: $pkgs"
}

# The etcd and Consul binaries are the ones scripts/services.sh builds once
# into its cache directory and names with `bin`, built by it first if they
# are not there yet (etcd in a minute or two, Consul in about 700 s of CPU
# on 2 cores): the two scripts never disagree on a version, and nothing is
# built twice. Set once in cmd_up, before the nodes' subshells start.
SERVICES_SH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/services.sh
need_etcd() {
	[[ -z ${ETCD_BIN:-} ]] || return 0
	ETCD_BIN=$("$SERVICES_SH" bin etcd)
}

need_consul() {
	[[ -z ${CONSUL_BIN:-} ]] || return 0
	CONSUL_BIN=$("$SERVICES_SH" bin consul)
}

# ---------------------------------------------------------------------------
# Process bookkeeping

# pid_of PIDFILE COMM: the pid in PIDFILE if that process is alive and is
# COMM, so a stale file whose pid was reused never leads to a wrong kill.
pid_of() {
	local file=$1 comm=$2 pid
	[[ -s $file ]] || return 1
	pid=$(head -n 1 "$file" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
	printf '%s\n' "$pid"
}

# A test that failed half way may leave a node SIGSTOPped; such a node would
# hold its port and answer nothing.
resume_if_stopped() {
	local pid=$1 state
	state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 0
	if [[ $state == T ]]; then
		warn "pid $pid was stopped (SIGSTOP): continuing it"
		kill -CONT "$pid" 2>/dev/null || true
	fi
}

# launch PIDFILE LOG CMD...: CMD in its own session, so that it outlives the
# caller (a test that restarts a node must not take it down when it ends),
# with no stdin and its output to LOG, so that a caller reading our stdout is
# not kept waiting. Every other descriptor is closed: fd 9 is our lock, and
# a caller's may be another (make test-clusters run under
# `flock /tmp/warden-suites.lock`): a node holding either would block every
# later run for as long as it lives.
launch() {
	local pidfile=$1 log=$2
	shift 2
	# A file left by an earlier run would read as a server that exited.
	rm -f "$pidfile"
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c 'echo $$ >"$0" || exit
		for fd in /proc/$$/fd/*; do fd=${fd##*/}; ((fd > 2)) && exec {fd}>&-; done
		exec "$@"' "$pidfile" "$@" </dev/null >>"$log" 2>&1 9>&- &
	# Return once the launched shell has written the pid file: whoever looks
	# next (up's second pass, wait_for) would otherwise find the node absent,
	# or catch the file created empty, before the shell writes it, take it
	# for a stale one and remove it, and start the node a second time.
	local i
	for ((i = 0; i < 200; i++)); do
		[[ -s $pidfile ]] && return 0
		sleep 0.05
	done
	warn "the launch wrote no pid file within 10s: $pidfile"
}

# starting PIDFILE COMM: whether the launched process is alive: COMM, or
# still the shell that wrote PIDFILE and has yet to exec COMM (on a busy
# machine that moment can outlast a probe).
starting() {
	pid_of "$1" "$2" >/dev/null || pid_of "$1" bash >/dev/null
}

# wait_for LOG PIDFILE COMM PROBE...: until PROBE succeeds; fails at the
# deadline or as soon as the node exits, with the end of its log.
wait_for() {
	local log=$1 pidfile=$2 comm=$3
	shift 3
	local deadline=$((SECONDS + TIMEOUT))
	while ! "$@"; do
		if [[ -s $pidfile ]] && ! starting "$pidfile" "$comm"; then
			warn "exited during startup; last lines of $log:"
			tail -n 30 "$log" >&2 || true
			return 1
		fi
		if ((SECONDS >= deadline)); then
			warn "not ready after ${TIMEOUT}s; last lines of $log:"
			tail -n 30 "$log" >&2 || true
			return 1
		fi
		sleep 0.3
	done
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# claim DIR COMM PORT...: whether the node must be started. A node of ours
# that is alive is left running, and so is one still being launched (the
# second pass of cmd_up can come before the first pass's shell has exec'd
# the server: its pid file was then taken for a stale one and removed, and
# the port the server took a moment later for another process's); a port
# held by anything else is an error.
claim() {
	local dir=$1 comm=$2 pid p
	shift 2
	if pid=$(pid_of "$dir/pid" "$comm"); then
		resume_if_stopped "$pid"
		return 1
	fi
	if starting "$dir/pid" "$comm"; then return 1; fi
	rm -f "$dir/pid"
	for p in "$@"; do
		port_taken "$p" && die "port $p is taken by a process this script did not start; the tests must own every node"
	done
	return 0
}

# ---------------------------------------------------------------------------
# Probes

redis_ping() { [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]; }

# /health is true once the member has a leader and can serve a read.
etcd_ok() { timeout 3 curl -fsS --max-time 2 "http://127.0.0.1:$1/health" 2>/dev/null | grep '"health":"true"' >/dev/null; }

zk_4lw() {
	# shellcheck disable=SC2016 # expanded by the inner bash
	timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf "%s" "$1" >&3 && cat <&3' "$1" "$2" 2>/dev/null || true
}

# A server serves once it is the leader or a follower of one.
zk_mode() { zk_4lw "$1" srvr | sed -n 's/^Mode: //p'; }
zk_ok() { [[ $(zk_mode "$1") == @(leader|follower) ]]; }

# An agent serves once it knows the leader: a server has then joined the
# Raft configuration or won an election, a client agent has joined a
# server. The answer is the leader's server RPC address.
consul_leader() { timeout 3 curl -fsS --max-time 2 "http://127.0.0.1:$1/v1/status/leader" 2>/dev/null | tr -d '"'; }
consul_ok() { [[ -n $(consul_leader "$1") ]]; }

# ---------------------------------------------------------------------------
# Nodes. Each start_* starts one node unless it already runs, and waits until
# it answers; it runs in a subshell of its own and exits non-zero on failure.

etcd_initial_cluster() {
	local i out=""
	for i in 0 1 2; do
		out+="${out:+,}etcd-${ETCD_CLIENT_PORTS[i]}=http://127.0.0.1:${ETCD_PEER_PORTS[i]}"
	done
	printf '%s\n' "$out"
}

# start_etcd INDEX WAIT: WAIT=no for the first start of the cluster, where a
# member cannot be healthy before a quorum of the others runs.
start_etcd() {
	local i=$1 wait=$2 port=${ETCD_CLIENT_PORTS[$1]} peer_port=${ETCD_PEER_PORTS[$1]}
	local name=etcd-$port dir=$STATE_DIR/etcd-$port
	SVC="clusters: $name"
	mkdir -p "$dir"
	if claim "$dir" etcd "$port" "$peer_port"; then
		need_etcd
		local peer=http://127.0.0.1:$peer_port client=http://127.0.0.1:$port data
		data=$("$SERVICES_SH" etcd-data "$dir")
		# The initial-cluster flags only matter the first time: a member
		# with a data directory rejoins with what it recorded. The default
		# 100 ms heartbeat and 1 s election timeout are kept, as the
		# tests' TTLs assume them.
		launch "$dir/pid" "$dir/etcd.log" "$ETCD_BIN" --name "$name" --data-dir "$data" \
			--listen-client-urls "$client" --advertise-client-urls "$client" \
			--listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
			--initial-cluster "$(etcd_initial_cluster)" --initial-cluster-state new \
			--initial-cluster-token warden-clusters \
			--heartbeat-interval 100 --election-timeout 1000 \
			--logger zap --log-outputs stderr
		say "launched"
	fi
	[[ $wait == yes ]] || return 0
	wait_for "$dir/etcd.log" "$dir/pid" etcd etcd_ok "$port"
	say "healthy (pid $(cat "$dir/pid"))"
}

start_zookeeper() {
	local i=$1 wait=$2 port=${ZK_CLIENT_PORTS[$1]}
	local name=zookeeper-$port dir=$STATE_DIR/zookeeper-$port
	SVC="clusters: $name"
	mkdir -p "$dir/conf" "$dir/data"
	if claim "$dir" java "$port" "${ZK_QUORUM_PORTS[i]}" "${ZK_ELECTION_PORTS[i]}"; then
		echo $((i + 1)) >"$dir/data/myid"
		# tickTime 200 ms: sessions expire in buckets of one tick, so a dead
		# client's session ends close to its timeout; sessions of at least a
		# second. syncLimit 15 ticks (3 s) before a follower that stopped
		# answering is dropped. The four-letter words are all allowed: the
		# tests find the leader with srvr.
		{
			cat <<-EOF
				tickTime=200
				initLimit=50
				syncLimit=15
				minSessionTimeout=1000
				maxSessionTimeout=60000
				dataDir=$dir/data
				clientPort=$port
				clientPortAddress=127.0.0.1
				maxClientCnxns=0
				admin.enableServer=false
				4lw.commands.whitelist=*
				forceSync=no
				reconfigEnabled=false
				standaloneEnabled=false
			EOF
			local j
			for j in 0 1 2; do
				echo "server.$((j + 1))=127.0.0.1:${ZK_QUORUM_PORTS[j]}:${ZK_ELECTION_PORTS[j]}"
			done
		} >"$dir/conf/zoo.cfg"
		cat >"$dir/conf/log4j.properties" <<-'EOF'
			log4j.rootLogger=INFO, CONSOLE
			log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
			log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
			log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
		EOF
		# Debian's zookeeper.jar names its other dependencies in its
		# manifest; only the slf4j binding and log4j must be added. Empty
		# container nodes (a lock nobody holds or waits for) are reaped
		# every second rather than every minute, so that the tests can
		# check that nothing is left behind.
		local cp="$dir/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
		launch "$dir/pid" "$dir/zookeeper.log" java -Xmx128m -Xss512k -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
			-Dlog4j.configuration="file:$dir/conf/log4j.properties" -Dzookeeper.jmx.log4j.disable=true \
			-Dznode.container.checkIntervalMs=1000 \
			-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/conf/zoo.cfg"
		say "launched"
	fi
	[[ $wait == yes ]] || return 0
	wait_for "$dir/zookeeper.log" "$dir/pid" java zk_ok "$port"
	say "serving as $(zk_mode "$port") (pid $(cat "$dir/pid"))"
}

start_redis() {
	local port=$1 name=redis-$1 dir=$STATE_DIR/redis-$1
	SVC="clusters: $name"
	mkdir -p "$dir"
	if claim "$dir" redis-server "$port" $((port + 10000)); then
		# No persistence: a killed master comes back empty, and rejoins as
		# a replica of whichever node was promoted in its place (its
		# nodes.conf tells it the cluster it belonged to).
		launch "$dir/pid" "$dir/redis.log" redis-server --port "$port" --bind 127.0.0.1 \
			--protected-mode no --daemonize no --dir "$dir" --logfile '' \
			--save '' --appendonly no \
			--cluster-enabled yes --cluster-config-file nodes.conf \
			--cluster-node-timeout "$REDIS_NODE_TIMEOUT"
	fi
	wait_for "$dir/redis.log" "$dir/pid" redis-server redis_ping "$port"
	say "answering (pid $(cat "$dir/pid"))"
}

# consul_common NAME DIR HTTP_PORT SERF_PORT: the flags of every agent of
# the datacenter. Every agent joins every server's Serf LAN port, and keeps
# its state (node id, Raft log and snapshots for a server) in its data
# directory, so that one killed comes back as itself. Raft runs at
# raft_multiplier 1, 1 s before a follower that hears nothing from its
# leader stands for election, like the etcd members' election timeout
# here: Consul's default of 5 is sized for slow machines, not for tests
# that time elections. Autopilot must not remove a server that the tests
# killed from the Raft configuration before they start it again.
#
# Gossip probes every 200 ms (Consul's LAN default: 1 s) and declares a
# member failed after 3 suspicion periods, not 4, so that Serf declares a
# killed or frozen server failed, and the client agent stops sending it
# requests, within a second of the fault, before the servers have elected
# a leader (2.4 to 4.7 s here). At the defaults Serf took about 5 s, after
# the election: the client agent kept sending requests to a frozen leader,
# each answered only by its RPC timeout, and the lock came back up to
# 1.8 s after the election (2 of 12 freezes past the bound, at load 12 to
# 19; with the faster gossip, 0 of 8, at most 0.76 s). Raft's own heartbeats, not Serf, decide elections, so the faster
# gossip moves no election.
consul_common() {
	local name=$1 dir=$2 http=$3 serf=$4 p
	CONSUL_ARGS=(agent -node "$name" -data-dir "$dir/data" -bind 127.0.0.1 -client 127.0.0.1
		-http-port "$http" -serf-lan-port "$serf" -serf-wan-port -1 -dns-port -1
		-grpc-port -1 -grpc-tls-port -1 -https-port -1 -log-level info
		-hcl 'performance { raft_multiplier = 1 }' -hcl 'autopilot { cleanup_dead_servers = false }'
		-hcl 'gossip_lan { probe_interval = "200ms" probe_timeout = "100ms" suspicion_mult = 3 }')
	for p in "${CONSUL_SERF_PORTS[@]}"; do
		[[ $p == "$serf" ]] || CONSUL_ARGS+=(-retry-join "127.0.0.1:$p")
	done
}

# start_consul INDEX WAIT: server INDEX (0-2), or the client agent for
# INDEX client. WAIT=no for the first start of the datacenter, where no
# server knows a leader before three of them run (bootstrap-expect 3).
start_consul() {
	local i=$1 wait=$2 http serf name dir
	local -a ports
	if [[ $i == client ]]; then
		http=$CONSUL_CLIENT_HTTP_PORT serf=$CONSUL_CLIENT_SERF_PORT
		ports=("$http" "$serf")
	else
		http=${CONSUL_HTTP_PORTS[i]} serf=${CONSUL_SERF_PORTS[i]}
		ports=("$http" "${CONSUL_SERVER_PORTS[i]}" "$serf")
	fi
	name=consul-$http dir=$STATE_DIR/consul-$http
	SVC="clusters: $name"
	mkdir -p "$dir"
	if claim "$dir" consul "${ports[@]}"; then
		need_consul
		consul_common "$name" "$dir" "$http" "$serf"
		if [[ $i != client ]]; then
			CONSUL_ARGS+=(-server -bootstrap-expect 3 -server-port "${CONSUL_SERVER_PORTS[i]}")
		else
			# The agent gives up an RPC to a server that does not answer
			# after 1 s, not Consul's default 60 s, and then sends the
			# next one to another server: a frozen server keeps its
			# connections open, and until Serf declares it failed the
			# agent keeps sending it requests that never return. The
			# agent moves a server to the back of its list at every
			# failed RPC, "no leader" answers during the election
			# included, so a frozen leader can come back to the front.
			# Not shorter: with 500 ms, a newly elected leader on a
			# loaded machine (load 14) answered too slowly for it, and
			# every request failed for 3 s after the election.
			CONSUL_ARGS+=(-hcl 'limits { rpc_client_timeout = "1s" }')
		fi
		launch "$dir/pid" "$dir/consul.log" "$CONSUL_BIN" "${CONSUL_ARGS[@]}"
		say "launched"
	fi
	[[ $wait == yes ]] || return 0
	wait_for "$dir/consul.log" "$dir/pid" consul consul_ok "$http"
	say "serving, leader $(consul_leader "$http") (pid $(cat "$dir/pid"))"
}

rcli() {
	local port=$1
	shift
	timeout 10 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

redis_info_field() { rcli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

# The cluster is usable once every node sees all slots served, six nodes,
# none of them failing, and every replica has a live link to its master.
redis_cluster_ok() {
	local p
	for p in "${REDIS_PORTS[@]}"; do
		[[ $(redis_info_field "$p" cluster_state) == ok ]] || return 1
		[[ $(redis_info_field "$p" cluster_known_nodes) == 6 ]] || return 1
		[[ $(redis_info_field "$p" cluster_slots_ok) == 16384 ]] || return 1
		if rcli "$p" cluster nodes 2>/dev/null | grep -E ' [^ ]*fail|-[<>]-' >/dev/null; then return 1; fi
		if rcli "$p" role 2>/dev/null | sed -n 1p | grep -x slave >/dev/null; then
			rcli "$p" info replication 2>/dev/null | tr -d '\r' | grep -x 'master_link_status:up' >/dev/null || return 1
		fi
	done
}

form_redis_cluster() {
	SVC="clusters: redis cluster"
	local p fresh=0 formed=0
	for p in "${REDIS_PORTS[@]}"; do
		if [[ $(redis_info_field "$p" cluster_known_nodes) == 1 && $(redis_info_field "$p" cluster_slots_assigned) == 0 ]]; then
			fresh=$((fresh + 1))
		elif [[ $(redis_info_field "$p" cluster_known_nodes) == 6 ]]; then
			formed=$((formed + 1))
		fi
	done
	if ((fresh == ${#REDIS_PORTS[@]})); then
		say "creating: 3 masters, 1 replica each"
		local -a addrs=()
		for p in "${REDIS_PORTS[@]}"; do addrs+=("127.0.0.1:$p"); done
		timeout 120 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
			>"$STATE_DIR/redis-cluster-create.log" 2>&1 || {
			warn "redis-cli --cluster create failed:"
			tail -n 30 "$STATE_DIR/redis-cluster-create.log" >&2
			return 1
		}
	elif ((formed != ${#REDIS_PORTS[@]})); then
		die "the Redis nodes disagree about their cluster ($fresh fresh, $formed formed of ${#REDIS_PORTS[@]}): run $0 clean, then up"
	elif rcli "${REDIS_PORTS[0]}" cluster nodes 2>/dev/null | grep -- '-[<>]-' >/dev/null; then
		# A test that died half way through a slot migration leaves the
		# slot open (MIGRATING/IMPORTING); redis-cli settles it.
		say "closing slots left open by an interrupted migration"
		timeout 120 redis-cli --cluster fix "127.0.0.1:${REDIS_PORTS[0]}" --cluster-yes \
			>"$STATE_DIR/redis-cluster-fix.log" 2>&1 || {
			warn "redis-cli --cluster fix failed:"
			tail -n 30 "$STATE_DIR/redis-cluster-fix.log" >&2
			return 1
		}
	fi
	local deadline=$((SECONDS + TIMEOUT))
	until redis_cluster_ok; do
		if ((SECONDS >= deadline)); then
			warn "cluster not ok after ${TIMEOUT}s:"
			rcli "${REDIS_PORTS[0]}" cluster nodes >&2 || true
			return 1
		fi
		sleep 0.5
	done
	say "ok: $(rcli "${REDIS_PORTS[0]}" cluster nodes | awk '$3 ~ /master/ {n++} END {print n}') masters with a replica each"
}

# ---------------------------------------------------------------------------
# Subcommands

lock() {
	exec 9>>"$LOCK_FILE"
	# Whoever creates it must not lock the others out.
	[[ ! -O $LOCK_FILE ]] || chmod 666 "$LOCK_FILE" 2>/dev/null || true
	flock -w 600 9 || die "another scripts/clusters.sh has held $LOCK_FILE for 10 minutes"
}

prepare_state_dir() {
	mkdir -p "$STATE_DIR"
	STATE_DIR=$(cd "$STATE_DIR" && pwd -P)
}

# wait_all NAME...: waits for the background jobs named in the jobs array.
declare -A JOBS=()
wait_all() {
	local name failed=()
	for name in "${!JOBS[@]}"; do
		wait "${JOBS[$name]}" || failed+=("$name")
	done
	JOBS=()
	[[ ${#failed[@]} -eq 0 ]] || die "could not start: ${failed[*]} (logs under $STATE_DIR)"
}

cmd_up() {
	lock
	install_missing
	prepare_state_dir
	local start=$SECONDS i p
	need_etcd
	need_consul
	say "starting nodes, state in $STATE_DIR"
	# Launch every member first: none is healthy before a quorum runs.
	for i in 0 1 2; do
		start_etcd "$i" no &
		JOBS[etcd-${ETCD_CLIENT_PORTS[i]}]=$!
		start_zookeeper "$i" no &
		JOBS[zookeeper-${ZK_CLIENT_PORTS[i]}]=$!
	done
	for p in "${REDIS_PORTS[@]}"; do
		start_redis "$p" &
		JOBS[redis-$p]=$!
	done
	for i in 0 1 2 client; do
		start_consul "$i" no &
		JOBS[consul-$i]=$!
	done
	wait_all
	for i in 0 1 2; do
		start_etcd "$i" yes &
		JOBS[etcd-${ETCD_CLIENT_PORTS[i]}]=$!
		start_zookeeper "$i" yes &
		JOBS[zookeeper-${ZK_CLIENT_PORTS[i]}]=$!
	done
	for i in 0 1 2 client; do
		start_consul "$i" yes &
		JOBS[consul-$i]=$!
	done
	form_redis_cluster &
	JOBS[redis cluster]=$!
	wait_all
	SVC=clusters
	say "etcd, ZooKeeper, Redis and Consul clusters ready in $((SECONDS - start))s"
}

# cmd_start NODE...: what a test calls to bring back a node it killed.
cmd_start() {
	[[ $# -gt 0 ]] || die "start: name the nodes, e.g. etcd-${ETCD_CLIENT_PORTS[0]}"
	lock
	prepare_state_dir
	local node i p
	for node in "$@"; do
		case $node in
		etcd-*)
			for i in 0 1 2; do [[ $node == "etcd-${ETCD_CLIENT_PORTS[i]}" ]] && start_etcd "$i" yes &&
				continue 2; done
			;;
		zookeeper-*)
			for i in 0 1 2; do [[ $node == "zookeeper-${ZK_CLIENT_PORTS[i]}" ]] && start_zookeeper "$i" yes &&
				continue 2; done
			;;
		redis-*)
			for p in "${REDIS_PORTS[@]}"; do [[ $node == "redis-$p" ]] && start_redis "$p" && continue 2; done
			;;
		consul-*)
			for i in 0 1 2; do [[ $node == "consul-${CONSUL_HTTP_PORTS[i]}" ]] && start_consul "$i" yes &&
				continue 2; done
			[[ $node == "consul-$CONSUL_CLIENT_HTTP_PORT" ]] && start_consul client yes && continue
			;;
		esac
		die "start: no node named $node (or it failed to start)"
	done
}

# stop DIR COMM: TERM (and CONT, for a node a test left stopped), then KILL
# if it has not gone after a while.
stop() {
	local dir=$1 comm=$2 name=${1##*/} pid
	if ! pid=$(pid_of "$dir/pid" "$comm"); then
		rm -f "$dir/pid"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null || true
	kill -CONT "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 30))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			warn "$name (pid $pid) ignored TERM for 30s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			break
		fi
		sleep 0.2
	done
	rm -f "$dir/pid"
	say "stopped $name (pid $pid)"
}

cmd_down() {
	lock
	if [[ ! -d $STATE_DIR ]]; then
		say "nothing to stop: no $STATE_DIR"
		return 0
	fi
	local d
	shopt -s nullglob
	for d in "$STATE_DIR"/redis-*/; do stop "${d%/}" redis-server & done
	for d in "$STATE_DIR"/etcd-*/; do stop "${d%/}" etcd & done
	for d in "$STATE_DIR"/zookeeper-*/; do stop "${d%/}" java & done
	for d in "$STATE_DIR"/consul-*/; do stop "${d%/}" consul & done
	local rc=0 j
	for j in $(jobs -p); do
		wait "$j" || rc=1
	done
	[[ $rc -eq 0 ]] || die "some nodes did not stop"
}

cmd_clean() {
	cmd_down
	rm -rf "$STATE_DIR"
	say "removed $STATE_DIR"
}

status_line() {
	local name=$1 dir=$2 comm=$3 ok=$4 role=$5 pid who state=up
	if pid=$(pid_of "$dir/pid" "$comm"); then who="pid $pid"; else who="not running"; fi
	$ok || state=DOWN
	printf '%-16s %-5s %-10s (%s)\n' "$name" "$state" "$role" "$who"
	[[ $state == up ]]
}

cmd_status() {
	local rc=0 p role
	for p in "${ETCD_CLIENT_PORTS[@]}"; do
		status_line "etcd-$p" "$STATE_DIR/etcd-$p" etcd "etcd_ok $p" member || rc=1
	done
	for p in "${ZK_CLIENT_PORTS[@]}"; do
		role=$(zk_mode "$p")
		status_line "zookeeper-$p" "$STATE_DIR/zookeeper-$p" java "zk_ok $p" "${role:--}" || rc=1
	done
	for p in "${REDIS_PORTS[@]}"; do
		role=$(rcli "$p" role 2>/dev/null | sed -n 1p) || true
		status_line "redis-$p" "$STATE_DIR/redis-$p" redis-server "redis_ping $p" "${role:--}" || rc=1
	done
	for p in "${CONSUL_HTTP_PORTS[@]}" "$CONSUL_CLIENT_HTTP_PORT"; do
		role=server
		[[ $p != "$CONSUL_CLIENT_HTTP_PORT" ]] || role=client
		status_line "consul-$p" "$STATE_DIR/consul-$p" consul "consul_ok $p" "$role" || rc=1
	done
	if redis_cluster_ok; then echo "redis cluster    ok"; else
		echo "redis cluster    NOT ok"
		rc=1
	fi
	return $rc
}

cmd_env() {
	printf "export WARDEN_CLUSTER_ETCD='%s'\n" "$(joined , "${ETCD_CLIENT_PORTS[@]}")"
	printf "export WARDEN_CLUSTER_ZK='%s'\n" "$(joined , "${ZK_CLIENT_PORTS[@]}")"
	printf "export WARDEN_CLUSTER_REDIS='%s'\n" "$(joined , "${REDIS_PORTS[@]}")"
	printf "export WARDEN_CLUSTER_CONSUL='%s'\n" "$(joined , "${CONSUL_HTTP_PORTS[@]}")"
	printf "export WARDEN_CLUSTER_CONSUL_CLIENT='127.0.0.1:%s'\n" "$CONSUL_CLIENT_HTTP_PORT"
	printf "export WARDEN_CLUSTERS_DIR='%s'\n" "$STATE_DIR"
}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status || exit 1 ;;
env) cmd_env ;;
clean) cmd_clean ;;
start)
	shift
	cmd_start "$@"
	;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
