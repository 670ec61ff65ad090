#!/usr/bin/env bash
# The servers warden's tests run against, on loopback, for a developer or CI.
#
#   scripts/services.sh up             install what is missing, start what is not answering
#   scripts/services.sh down           stop what `up` started (and nothing else)
#   scripts/services.sh status         which servers answer, and who started them
#   scripts/services.sh env            export lines for the tests: eval "$(scripts/services.sh env)"
#   scripts/services.sh clean          down, then delete the state directory
#   scripts/services.sh bin NAME       the path of the etcd or consul binary the tests run, built first if missing
#   scripts/services.sh etcd-data DIR  the data directory of an etcd member under DIR, for that binary
#
# Servers go where the WARDEN_* variables that `env` prints point (defaults
# below), so `up` and the tests always agree; a variable naming another host
# is left to whoever runs that host. Everything a server writes (data, logs,
# pid files) lives under WARDEN_SERVICES_DIR (default /tmp/warden-services).
# A server that already answers on its port is used as it is and never
# stopped by `down`, so this can run next to servers someone else started.
set -Eeuo pipefail

SVC=services
say() { printf '%s: %s\n' "$SVC" "$*"; }
warn() { printf '%s: %s\n' "$SVC" "$*" >&2; }
die() {
	warn "$*"
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }
# A failing `return` was already explained by whoever returned.
trap '[[ $BASH_COMMAND == return* ]] || warn "failed (exit $?): $BASH_COMMAND"' ERR

STATE_DIR=${WARDEN_SERVICES_DIR:-/tmp/warden-services}
# Per server: a JVM or a first mariadb-install-db on a loaded 2-core machine
# can take tens of seconds, and failing early would only make CI flaky.
TIMEOUT=${WARDEN_SERVICES_TIMEOUT:-90}
# Ports are machine-wide, so concurrent runs are serialized machine-wide too,
# whatever state directory each of them uses.
LOCK_FILE=${TMPDIR:-/tmp}/warden-services.lock

ENV_VARS=(WARDEN_REDIS_ADDR WARDEN_REDLOCK_ADDRS WARDEN_ETCD_ENDPOINTS WARDEN_ZK_SERVERS WARDEN_POSTGRES_DSN WARDEN_MYSQL_DSN WARDEN_CONSUL_ADDR)
declare -A ENV_DEFAULTS=(
	[WARDEN_REDIS_ADDR]="127.0.0.1:16379"
	[WARDEN_REDLOCK_ADDRS]="127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"
	[WARDEN_ETCD_ENDPOINTS]="127.0.0.1:12379"
	[WARDEN_ZK_SERVERS]="127.0.0.1:12181"
	[WARDEN_POSTGRES_DSN]="postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"
	[WARDEN_MYSQL_DSN]="warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true"
	[WARDEN_CONSUL_ADDR]="127.0.0.1:18500"
)
envval() { printf '%s\n' "${!1:-${ENV_DEFAULTS[$1]}}"; }

if [[ $EUID -eq 0 ]]; then
	SUDO=()
	PG_OS_USER=postgres
	MY_OS_USER=mysql
else
	SUDO=(sudo)
	# Without root the servers cannot switch users, so they run as whoever
	# runs this script.
	PG_OS_USER=$(id -un)
	MY_OS_USER=$(id -un)
fi

# ---------------------------------------------------------------------------
# Where the servers go, from the WARDEN_* variables. An empty port means the
# variable names another host, so no server is started for it.

# local_port VAR ENTRY: the port of ENTRY (host:port, maybe with a scheme or
# a ZooKeeper chroot) if its host is this machine.
local_port() {
	local var=$1 a=$2 host port
	a=${a#*://}
	a=${a%%/*}
	host=${a%:*}
	port=${a##*:}
	[[ $port =~ ^[0-9]+$ && $host != "$a" ]] || die "$var: cannot read host:port from '$2'"
	case $host in
	127.0.0.1 | localhost | '[::1]') printf '%s\n' "$port" ;;
	*) warn "$var points at $host, not this machine: not starting a server for it" ;;
	esac
}

# Credentials end up inside SQL statements, so only plain words are taken.
check_word() {
	[[ $2 =~ ^[A-Za-z0-9_]+$ ]] || die "$1: '$2' must be letters, digits or _ for scripts/services.sh to create it"
}

load_config() {
	local v entry p
	local -a entries
	REDIS_PORTS=()
	for v in WARDEN_REDIS_ADDR WARDEN_REDLOCK_ADDRS; do
		IFS=, read -ra entries <<<"$(envval "$v")"
		for entry in "${entries[@]}"; do
			p=$(local_port "$v" "$entry")
			[[ -z $p ]] || REDIS_PORTS+=("$p")
		done
	done
	mapfile -t REDIS_PORTS < <(printf '%s\n' "${REDIS_PORTS[@]}" | sort -nu | { grep . || true; })

	v=$(envval WARDEN_ETCD_ENDPOINTS)
	ETCD_PORT=$(local_port WARDEN_ETCD_ENDPOINTS "${v%%,*}")
	[[ -z $ETCD_PORT ]] || ETCD_PEER_PORT=$((ETCD_PORT + 1))

	v=$(envval WARDEN_ZK_SERVERS)
	ZK_PORT=$(local_port WARDEN_ZK_SERVERS "${v%%,*}")

	v=$(envval WARDEN_POSTGRES_DSN)
	local re='^postgres(ql)?://([^:@/]+):([^@/]*)@([^/?]+)/([^?]+)'
	[[ $v =~ $re ]] || die "WARDEN_POSTGRES_DSN: expected postgres://user:password@host:port/db, got '$v'"
	PG_ROLE=${BASH_REMATCH[2]} PG_PASSWORD=${BASH_REMATCH[3]} PG_DB=${BASH_REMATCH[5]}
	PG_PORT=$(local_port WARDEN_POSTGRES_DSN "${BASH_REMATCH[4]}")
	PG_DSN=$v
	check_word WARDEN_POSTGRES_DSN "$PG_ROLE"
	check_word WARDEN_POSTGRES_DSN "$PG_PASSWORD"
	check_word WARDEN_POSTGRES_DSN "$PG_DB"

	v=$(envval WARDEN_MYSQL_DSN)
	re='^([^:@/]+):([^@/]*)@tcp\(([^)]+)\)/([^?]*)'
	[[ $v =~ $re ]] || die "WARDEN_MYSQL_DSN: expected user:password@tcp(host:port)/db, got '$v'"
	MY_USERNAME=${BASH_REMATCH[1]} MY_PASSWORD=${BASH_REMATCH[2]} MY_DB=${BASH_REMATCH[4]}
	MY_PORT=$(local_port WARDEN_MYSQL_DSN "${BASH_REMATCH[3]}")
	check_word WARDEN_MYSQL_DSN "$MY_USERNAME"
	check_word WARDEN_MYSQL_DSN "$MY_PASSWORD"
	check_word WARDEN_MYSQL_DSN "$MY_DB"

	CONSUL_PORT=$(local_port WARDEN_CONSUL_ADDR "$(envval WARDEN_CONSUL_ADDR)")
}

# ---------------------------------------------------------------------------
# Installation

pg_bindir() {
	local d
	d=$({ ls -d /usr/lib/postgresql/*/bin 2>/dev/null || true; } | sort -V | tail -n 1)
	[[ -n $d && -x $d/initdb && -x $d/pg_ctl ]] || return 1
	printf '%s\n' "$d"
}

missing_packages() {
	{ have redis-server && have redis-cli; } || echo redis-server redis-tools
	[[ -f /usr/share/java/zookeeper.jar && -f /usr/share/java/slf4j-log4j12.jar && -f /usr/share/java/log4j-1.2.jar ]] || echo zookeeper
	have java || echo default-jre-headless
	pg_bindir >/dev/null || echo postgresql
	{ have psql && have pg_isready; } || echo postgresql-client
	{ have mariadbd && have mariadb-install-db; } || echo mariadb-server
	{ have mariadb && have mariadb-admin; } || echo mariadb-client
	have curl || echo curl
	{ have runuser && have setsid && have flock; } || echo util-linux
	# Not a server: the debug page's test renders it in headless Chromium.
	have chromium || echo chromium
	# Not a shared server: sqllock's test starts a PgBouncer of its own in
	# front of PostgreSQL.
	have pgbouncer || [[ -x /usr/sbin/pgbouncer ]] || echo pgbouncer
}

install_missing() {
	local pkgs
	pkgs=$(missing_packages | xargs)
	[[ -n $pkgs ]] || return 0
	if [[ $EUID -ne 0 ]] && ! have sudo; then
		die "missing packages ($pkgs), and not root: install them, or run as root"
	fi
	say "installing: $pkgs"
	# Package post-install scripts would otherwise start system-wide servers
	# on the default ports, or fail where there is no init system. A policy
	# that denies every start stays only for the install, and only if we made it.
	local made_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
		"${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
		made_policy=1
	fi
	local rc=0
	# shellcheck disable=SC2086 # $pkgs is a list of words
	{
		"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update &&
			"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
				--no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $pkgs
	} || rc=$?
	[[ -z $made_policy ]] || "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
	[[ $rc -eq 0 ]] || die "apt-get failed (exit $rc) installing: $pkgs"
	pkgs=$(missing_packages | xargs)
	[[ -z $pkgs ]] || die "still missing after apt-get install: $pkgs"
}

# Servers built from their Go modules, once, into a cache outside the
# repository that later runs (and clean clones) reuse: WARDEN_CACHE_DIR, or
# warden/ under the user's cache directory. WARDEN_CONSUL_BIN and
# WARDEN_ETCD_BIN name other binaries to use instead (an older etcd, say).
CACHE_DIR=${WARDEN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/warden}
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Consul is not packaged by Debian. The Consul server is licensed BUSL-1.1:
# it is built and run here only as a local test server. It is never a
# dependency of warden's module (go.mod requires only its MPL-2.0 api
# client), and neither its code nor the binary is ever committed.
CONSUL_VERSION=v1.20.1
CONSUL_BIN=${WARDEN_CONSUL_BIN:-$CACHE_DIR/consul-$CONSUL_VERSION/consul}

# etcd's server at the version of the client warden is built with, read from
# go.mod, so that the tests run against the server the client is made for.
# Debian packages etcd 3.4, whose leader, frozen and then continued, can
# revoke leases it counts as expired before it learns it lost leadership
# (etcd-io/etcd#15247): a lock held twice, which no test here should see.
ETCD_VERSION=$(sed -n 's|^[[:space:]]*go\.etcd\.io/etcd/client/v3 \(v[^[:space:]]*\).*|\1|p' "$REPO_DIR/go.mod")
[[ -n $ETCD_VERSION ]] || die "no go.etcd.io/etcd/client/v3 requirement in $REPO_DIR/go.mod"
ETCD_BIN=${WARDEN_ETCD_BIN:-$CACHE_DIR/etcd-$ETCD_VERSION/etcd}

# build_module BIN MODULE@VERSION: builds the main package at the root of
# MODULE into BIN unless it is there, under a lock of its own so that two
# runs do not build it at once. A module zip lacks the sibling modules its
# go.mod's replace block points at (Consul's api and sdk, etcd's api, pkg
# and client), so the block is dropped and the published versions it
# requires come from the module proxy; GOTOOLCHAIN=local builds with the Go
# at hand rather than fetching the toolchain go.mod suggests.
build_module() {
	local bin=$1 mod=$2
	[[ ! -x $bin ]] || return 0
	[[ $bin == "$CACHE_DIR"/* ]] || die "$bin, named by WARDEN_*_BIN, is not an executable"
	have go || die "go is needed to build $mod"
	mkdir -p "${bin%/*}"
	(
		flock -w 3600 8 || die "another run has been building $bin for an hour"
		[[ -x $bin ]] || build_module_locked "$bin" "$mod"
	) 8>>"${bin%/*}.lock"
}

build_module_locked() {
	local bin=$1 mod=$2 start=$SECONDS tmp dir
	say "building $mod into $bin, once"
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/warden-build.XXXXXX")
	dir=$(cd "$tmp" && go mod download -json "$mod" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[[ -n $dir && -f $dir/go.mod ]] || die "go mod download $mod gave no source directory"
	cp -R "$dir" "$tmp/src"
	chmod -R u+w "$tmp/src"
	awk '/^replace \(/ { skip = 1; next } skip && /^\)/ { skip = 0; next } skip || /^replace / { next } { print }' \
		"$tmp/src/go.mod" >"$tmp/go.mod" && mv "$tmp/go.mod" "$tmp/src/go.mod"
	if ! (cd "$tmp/src" && GOFLAGS=-mod=mod GOTOOLCHAIN=local nice -n 10 go build -o "$bin.part" .) >"$tmp/build.log" 2>&1; then
		warn "building $mod failed; last lines of $tmp/build.log:"
		tail -n 30 "$tmp/build.log" >&2
		return 1
	fi
	mv "$bin.part" "$bin"
	rm -rf "$tmp"
	say "built $mod in $((SECONDS - start))s"
}

# About 700 s of CPU on 2 cores.
install_consul() { build_module "$CONSUL_BIN" "github.com/hashicorp/consul@$CONSUL_VERSION"; }

# The server module's root is etcd's main package.
install_etcd() { build_module "$ETCD_BIN" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"; }

# etcd_data_dir DIR: where a member under DIR keeps its data: a directory
# per server version, because etcd upgrades its data one minor version at a
# time and cannot go back, and test data is not worth migrating; the
# directories of other versions are removed.
etcd_data_dir() {
	local dir=$1 version d
	version=$("$ETCD_BIN" --version | sed -n 's/^etcd Version: //p')
	[[ -n $version ]] || die "$ETCD_BIN --version names no version"
	for d in "$dir"/data "$dir"/data-*; do
		[[ ! -e $d || $d == "$dir/data-$version" ]] || rm -rf "$d"
	done
	printf '%s\n' "$dir/data-$version"
}

# ---------------------------------------------------------------------------
# Process bookkeeping

# as_user USER CMD...: CMD as USER, from a directory USER can enter (initdb
# and psql complain when the current directory is root's home).
as_user() {
	local user=$1
	shift
	if [[ $EUID -eq 0 && $user != root ]]; then
		(cd / && runuser -u "$user" -- "$@")
	else
		"$@"
	fi
}

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

# launch PIDFILE LOG CMD...: CMD in its own session (so it outlives the
# caller's terminal or CI job), with no stdin and output to LOG (so a caller
# reading our stdout is not kept waiting by the server), recording its pid.
# fd 9 is the lock: a server holding it would block every later run.
launch() {
	local pidfile=$1 log=$2
	shift 2
	# A file left by an earlier run would read as a server that exited.
	rm -f "$pidfile"
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c 'echo $$ >"$0" && exec "$@"' "$pidfile" "$@" </dev/null >>"$log" 2>&1 9>&- &
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
# deadline or as soon as the server exits, with the end of its log.
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
			warn "not answering after ${TIMEOUT}s; last lines of $log:"
			tail -n 30 "$log" >&2 || true
			return 1
		fi
		sleep 0.2
	done
}

# already_up PIDFILE COMM ADDR: reports a server that answered before we
# started anything; returns whether an earlier `up` started it.
already_up() {
	local pidfile=$1 comm=$2 addr=$3 pid
	if pid=$(pid_of "$pidfile" "$comm"); then
		say "already running on $addr (pid $pid, started by an earlier up)"
		return 0
	fi
	rm -f "$pidfile"
	say "something else already answers on $addr: using it as it is; down will leave it alone"
	return 1
}

# ---------------------------------------------------------------------------
# Probes: whether a server that speaks the protocol answers on the port.

redis_ping() { [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]; }

etcd_ok() { timeout 3 curl -fsS --max-time 2 "http://127.0.0.1:$1/health" 2>/dev/null | grep '"health":"true"' >/dev/null; }

# A ZooKeeper that does not whitelist srvr still says so, which is enough to
# know it is one.
zk_ok() {
	local out
	# shellcheck disable=SC2016 # expanded by the inner bash
	out=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf srvr >&3 && cat <&3' "$1" 2>/dev/null) || true
	[[ $out == *"Zookeeper version"* || $out == *"whitelist"* ]]
}

pg_ok() { pg_isready -q -h 127.0.0.1 -p "$1" -t 3 >/dev/null 2>&1; }

# An agent answers its leader's address once its server has been elected.
consul_ok() { timeout 3 curl -fsS --max-time 2 "http://127.0.0.1:$1/v1/status/leader" 2>/dev/null | grep '^"[^"]' >/dev/null; }

# ping succeeds for a running server even when it denies access.
mariadb_ok() { timeout 5 mariadb-admin --no-defaults --protocol=tcp -h 127.0.0.1 -P "$1" --connect-timeout=3 -u ping ping >/dev/null 2>&1; }

# ---------------------------------------------------------------------------
# Servers. Each start_* runs in a background subshell of its own, with set -e
# in force, and exits non-zero if its server cannot be made to answer.

start_redis() {
	local port=$1 dir=$STATE_DIR/redis-$1
	SVC="services: redis :$port"
	if redis_ping "$port"; then
		already_up "$dir/pid" redis-server "127.0.0.1:$port" || true
		return 0
	fi
	mkdir -p "$dir"
	launch "$dir/pid" "$dir/redis.log" redis-server --port "$port" --bind 127.0.0.1 \
		--save '' --appendonly no --daemonize no --dir "$dir" --logfile ''
	wait_for "$dir/redis.log" "$dir/pid" redis-server redis_ping "$port"
	say "started (pid $(cat "$dir/pid"))"
}

start_etcd() {
	local port=$ETCD_PORT dir=$STATE_DIR/etcd-$ETCD_PORT
	SVC="services: etcd :$port"
	if etcd_ok "$port"; then
		already_up "$dir/pid" etcd "127.0.0.1:$port" || true
		etcd_version_check "$port"
		return 0
	fi
	install_etcd
	mkdir -p "$dir"
	local peer=http://127.0.0.1:$ETCD_PEER_PORT client=http://127.0.0.1:$port data
	data=$(etcd_data_dir "$dir")
	launch "$dir/pid" "$dir/etcd.log" "$ETCD_BIN" --name warden --data-dir "$data" \
		--listen-client-urls "$client" --advertise-client-urls "$client" \
		--listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
		--initial-cluster "warden=$peer" --logger zap --log-outputs stderr
	wait_for "$dir/etcd.log" "$dir/pid" etcd etcd_ok "$port"
	say "started (pid $(cat "$dir/pid"))"
}

# etcd_version_check PORT: a server found running (one an earlier up
# started from Debian's package, say) may not be the version the tests are
# for; it is used all the same, but not silently.
etcd_version_check() {
	local running
	running=$(timeout 3 curl -fsS --max-time 2 "http://127.0.0.1:$1/version" 2>/dev/null |
		sed -n 's/.*"etcdserver":"\([^"]*\)".*/\1/p') || true
	[[ v$running == "$ETCD_VERSION" ]] ||
		warn "the etcd on 127.0.0.1:$1 is ${running:-of an unknown version}, not $ETCD_VERSION: the tests run against it as it is"
}

start_zookeeper() {
	local port=$ZK_PORT dir=$STATE_DIR/zookeeper-$ZK_PORT
	SVC="services: zookeeper :$port"
	if zk_ok "$port"; then
		already_up "$dir/pid" java "127.0.0.1:$port" || true
		return 0
	fi
	mkdir -p "$dir/conf" "$dir/data"
	# A short tick: the server expires sessions in buckets of one tick, so
	# a dead client's session ends at most a tick after its timeout (the
	# kill -9 tests count on it); sessions stay at least a second long; no
	# connection limit because parallel test packages all connect from
	# 127.0.0.1.
	cat >"$dir/conf/zoo.cfg" <<-EOF
		tickTime=200
		minSessionTimeout=1000
		maxSessionTimeout=60000
		dataDir=$dir/data
		clientPort=$port
		clientPortAddress=127.0.0.1
		maxClientCnxns=0
		admin.enableServer=false
		4lw.commands.whitelist=*
		forceSync=no
	EOF
	cat >"$dir/conf/log4j.properties" <<-'EOF'
		log4j.rootLogger=INFO, CONSOLE
		log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
		log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
		log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
	EOF
	# Debian's zookeeper.jar names its other dependencies in its manifest;
	# only the slf4j binding and log4j must be added, or it logs nothing.
	local cp="$dir/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
	launch "$dir/pid" "$dir/zookeeper.log" java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Dlog4j.configuration="file:$dir/conf/log4j.properties" -Dzookeeper.jmx.log4j.disable=true \
		-cp "$cp" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/conf/zoo.cfg"
	wait_for "$dir/zookeeper.log" "$dir/pid" java zk_ok "$port"
	say "started (pid $(cat "$dir/pid"))"
}

start_postgres() {
	local port=$PG_PORT dir=$STATE_DIR/postgres-$PG_PORT bin
	SVC="services: postgres :$port"
	bin=$(pg_bindir)
	local data=$dir/data run=$dir/run log=$dir/postgres.log
	if pg_ok "$port"; then
		if already_up "$data/postmaster.pid" postgres "127.0.0.1:$port"; then
			provision_postgres "$run"
		fi
		return 0
	fi
	mkdir -p "$dir" "$run"
	touch "$log"
	[[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$dir" "$run" "$log"
	chmod 755 "$dir" "$run"
	if [[ ! -s $data/PG_VERSION ]]; then
		rm -rf "$data"
		say "initdb $data"
		as_user "$PG_OS_USER" "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
			--encoding=UTF8 --locale=C --no-sync >>"$log" 2>&1 || {
			warn "initdb failed; last lines of $log:"
			tail -n 30 "$log" >&2
			return 1
		}
		# Throwaway test data: durability is traded for speed.
		cat >>"$data/postgresql.conf" <<-EOF

			# scripts/services.sh
			max_connections = 300
			fsync = off
			synchronous_commit = off
			full_page_writes = off
			include_if_exists = 'services.conf'
		EOF
	fi
	# Rewritten at every start so a changed WARDEN_POSTGRES_DSN port applies.
	cat >"$data/services.conf" <<-EOF
		listen_addresses = '127.0.0.1'
		port = $port
		unix_socket_directories = '$run'
	EOF
	[[ $EUID -ne 0 ]] || chown "$PG_OS_USER:" "$data/services.conf"
	# pg_ctl -w notices a postmaster that dies at once (port taken, bad
	# config) instead of waiting out the deadline.
	local -a asu=()
	[[ $EUID -ne 0 ]] || asu=(runuser -u "$PG_OS_USER" --)
	# shellcheck disable=SC2094 # both only append
	if ! (cd / && setsid -w "${asu[@]}" "$bin/pg_ctl" -D "$data" -l "$log" -w -t "$TIMEOUT" start \
		</dev/null >>"$log" 2>&1 9>&-); then
		warn "did not start; last lines of $log:"
		tail -n 30 "$log" >&2
		return 1
	fi
	wait_for "$log" "$data/postmaster.pid" postgres pg_ok "$port"
	provision_postgres "$run"
	say "started (pid $(pid_of "$data/postmaster.pid" postgres))"
}

provision_postgres() {
	local run=$1
	local -a psql=(psql -X -q -v ON_ERROR_STOP=1 -h "$run" -p "$PG_PORT" -U postgres -d postgres)
	as_user "$PG_OS_USER" "${psql[@]}" -c "DO \$\$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
			CREATE ROLE $PG_ROLE LOGIN SUPERUSER;
		END IF;
	END \$\$;
	ALTER ROLE $PG_ROLE PASSWORD '$PG_PASSWORD';"
	if [[ -z $(as_user "$PG_OS_USER" "${psql[@]}" -Atc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ]]; then
		as_user "$PG_OS_USER" "${psql[@]}" -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
	fi
	# What the tests do: the DSN, over TCP, with the password.
	psql -X -q "$PG_DSN" -Atc 'SELECT 1' >/dev/null
}

start_mariadb() {
	local port=$MY_PORT dir=$STATE_DIR/mariadb-$MY_PORT
	SVC="services: mariadb :$port"
	local data=$dir/data run=$dir/run log=$dir/mariadb.log
	if mariadb_ok "$port"; then
		if already_up "$dir/pid" mariadbd "127.0.0.1:$port"; then
			provision_mariadb "$run/mysqld.sock"
		fi
		return 0
	fi
	mkdir -p "$dir" "$run"
	touch "$log"
	[[ $EUID -ne 0 ]] || chown "$MY_OS_USER:" "$dir" "$run" "$log"
	chmod 755 "$dir" "$run"
	if [[ ! -d $data/mysql ]]; then
		rm -rf "$data"
		say "mariadb-install-db $data"
		mariadb-install-db --no-defaults --datadir="$data" --user="$MY_OS_USER" \
			--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
			</dev/null >>"$log" 2>&1 9>&- || {
			warn "mariadb-install-db failed; last lines of $log:"
			tail -n 30 "$log" >&2
			return 1
		}
	fi
	# Throwaway test data: durability is traded for speed.
	launch "$dir/pid" "$log" mariadbd --no-defaults --user="$MY_OS_USER" --datadir="$data" \
		--port="$port" --bind-address=127.0.0.1 --socket="$run/mysqld.sock" \
		--pid-file="$run/mariadbd.pid" --skip-name-resolve --max-connections=500 \
		--character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
		--innodb-flush-log-at-trx-commit=0 --sync-binlog=0
	wait_for "$log" "$dir/pid" mariadbd mariadb_ok "$port"
	provision_mariadb "$run/mysqld.sock"
	say "started (pid $(cat "$dir/pid"))"
}

provision_mariadb() {
	local sock=$1 u
	# The socket can lag the TCP port by a moment.
	local deadline=$((SECONDS + 10))
	until [[ -S $sock ]] || ((SECONDS >= deadline)); do sleep 0.2; done
	local sql="CREATE DATABASE IF NOT EXISTS $MY_DB;"
	# 127.0.0.1 for the tests' TCP connections, localhost for the socket.
	for u in "'$MY_USERNAME'@'127.0.0.1'" "'$MY_USERNAME'@'localhost'"; do
		sql+="CREATE USER IF NOT EXISTS $u; ALTER USER $u IDENTIFIED BY '$MY_PASSWORD';"
		sql+="GRANT ALL PRIVILEGES ON *.* TO $u;"
	done
	mariadb --no-defaults -u root --socket="$sock" -e "$sql"
	# What the tests do: TCP to 127.0.0.1 with the password.
	mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$MY_PORT" -u "$MY_USERNAME" -p"$MY_PASSWORD" "$MY_DB" \
		-e 'SELECT 1' >/dev/null
}

# A dev agent: one server, state in memory. Every port it would open is
# moved next to the HTTP port (server RPC +1, Serf LAN +2) or disabled, so
# that it collides with none of the other servers, the cluster suite
# (17100-17199) or the fault suite (171xx, 173xx, 174xx).
start_consul() {
	local port=$CONSUL_PORT dir=$STATE_DIR/consul-$CONSUL_PORT
	SVC="services: consul :$port"
	if consul_ok "$port"; then
		already_up "$dir/pid" consul "127.0.0.1:$port" || true
		return 0
	fi
	install_consul
	mkdir -p "$dir"
	launch "$dir/pid" "$dir/consul.log" "$CONSUL_BIN" agent -dev -bind 127.0.0.1 -client 127.0.0.1 \
		-node warden-dev -http-port "$port" -server-port $((port + 1)) -serf-lan-port $((port + 2)) \
		-serf-wan-port -1 -dns-port -1 -grpc-port -1 -grpc-tls-port -1 -https-port -1
	wait_for "$dir/consul.log" "$dir/pid" consul consul_ok "$port"
	say "started (pid $(cat "$dir/pid"))"
}

# ---------------------------------------------------------------------------
# Subcommands

lock() {
	exec 9>>"$LOCK_FILE"
	# Whoever creates it must not lock the others out.
	[[ ! -O $LOCK_FILE ]] || chmod 666 "$LOCK_FILE" 2>/dev/null || true
	flock -w 600 9 || die "another scripts/services.sh has held $LOCK_FILE for 10 minutes"
}

prepare_state_dir() {
	mkdir -p "$STATE_DIR"
	STATE_DIR=$(cd "$STATE_DIR" && pwd -P)
	chmod 755 "$STATE_DIR"
	[[ $EUID -eq 0 ]] || return 0
	# The postgres and mysql users must be able to reach their directories.
	local p=$STATE_DIR
	while [[ $p != / ]]; do
		p=$(dirname "$p")
		if [[ -z $(find "$p" -maxdepth 0 -perm -o=x) ]]; then
			say "chmod o+x $p, so that the postgres and mysql users can reach $STATE_DIR"
			chmod o+x "$p"
		fi
	done
}

cmd_up() {
	load_config
	lock
	install_missing
	prepare_state_dir
	local start=$SECONDS port name
	say "starting servers, state in $STATE_DIR"
	# In parallel: the JVM, initdb and mariadb-install-db each take seconds.
	local -A jobs=()
	for port in "${REDIS_PORTS[@]}"; do
		start_redis "$port" &
		jobs[redis :$port]=$!
	done
	if [[ -n $ETCD_PORT ]]; then
		start_etcd &
		jobs[etcd]=$!
	fi
	if [[ -n $ZK_PORT ]]; then
		start_zookeeper &
		jobs[zookeeper]=$!
	fi
	if [[ -n $PG_PORT ]]; then
		start_postgres &
		jobs[postgres]=$!
	fi
	if [[ -n $MY_PORT ]]; then
		start_mariadb &
		jobs[mariadb]=$!
	fi
	if [[ -n $CONSUL_PORT ]]; then
		start_consul &
		jobs[consul]=$!
	fi
	local -a failed=()
	for name in "${!jobs[@]}"; do
		wait "${jobs[$name]}" || failed+=("$name")
	done
	[[ ${#failed[@]} -eq 0 ]] || die "could not start: ${failed[*]} (logs under $STATE_DIR)"
	say "all servers answering (${#jobs[@]} started or found in $((SECONDS - start))s)"
}

# stop DIR PIDFILE COMM: TERM, then KILL if it has not gone after a while.
stop() {
	local name=${1##*/} pidfile=$2 comm=$3 pid
	if ! pid=$(pid_of "$pidfile" "$comm"); then
		rm -f "$pidfile"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 30))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			warn "$name (pid $pid) ignored TERM for 30s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			break
		fi
		sleep 0.2
	done
	rm -f "$pidfile"
	say "stopped $name (pid $pid)"
}

stop_postgres() {
	local dir=$1 pid bin
	pid=$(pid_of "$dir/data/postmaster.pid" postgres) || return 0
	bin=$(pg_bindir) || die "cannot stop postgres (pid $pid): no pg_ctl found"
	as_user "$PG_OS_USER" "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
	say "stopped ${dir##*/} (pid $pid)"
}

# Whatever the pid files under the state directory name, so servers an
# earlier `up` started with other WARDEN_* values are stopped too.
cmd_down() {
	lock
	if [[ ! -d $STATE_DIR ]]; then
		say "nothing to stop: no $STATE_DIR"
		return 0
	fi
	local d
	shopt -s nullglob
	for d in "$STATE_DIR"/redis-*/; do stop "${d%/}" "${d}pid" redis-server & done
	for d in "$STATE_DIR"/etcd-*/; do stop "${d%/}" "${d}pid" etcd & done
	for d in "$STATE_DIR"/zookeeper-*/; do stop "${d%/}" "${d}pid" java & done
	for d in "$STATE_DIR"/mariadb-*/; do stop "${d%/}" "${d}pid" mariadbd & done
	for d in "$STATE_DIR"/consul-*/; do stop "${d%/}" "${d}pid" consul & done
	for d in "$STATE_DIR"/postgres-*/; do stop_postgres "${d%/}" & done
	local rc=0 j
	for j in $(jobs -p); do
		wait "$j" || rc=1
	done
	[[ $rc -eq 0 ]] || die "some servers did not stop"
}

cmd_clean() {
	cmd_down
	rm -rf "$STATE_DIR"
	say "removed $STATE_DIR"
}

# status_line NAME PORT PIDFILE COMM PROBE
status_line() {
	local name=$1 port=$2 pidfile=$3 comm=$4 probe=$5 pid who state=up
	if pid=$(pid_of "$pidfile" "$comm"); then who="started by up, pid $pid"; else who="not started by up"; fi
	"$probe" "$port" || state=DOWN
	printf '%-10s 127.0.0.1:%-6s %-5s (%s)\n' "$name" "$port" "$state" "$who"
	[[ $state == up ]]
}

cmd_status() {
	load_config
	local rc=0 port
	for port in "${REDIS_PORTS[@]}"; do
		status_line redis "$port" "$STATE_DIR/redis-$port/pid" redis-server redis_ping || rc=1
	done
	[[ -z $ETCD_PORT ]] || status_line etcd "$ETCD_PORT" "$STATE_DIR/etcd-$ETCD_PORT/pid" etcd etcd_ok || rc=1
	[[ -z $ZK_PORT ]] || status_line zookeeper "$ZK_PORT" "$STATE_DIR/zookeeper-$ZK_PORT/pid" java zk_ok || rc=1
	[[ -z $PG_PORT ]] || status_line postgres "$PG_PORT" "$STATE_DIR/postgres-$PG_PORT/data/postmaster.pid" postgres pg_ok || rc=1
	[[ -z $MY_PORT ]] || status_line mariadb "$MY_PORT" "$STATE_DIR/mariadb-$MY_PORT/pid" mariadbd mariadb_ok || rc=1
	[[ -z $CONSUL_PORT ]] || status_line consul "$CONSUL_PORT" "$STATE_DIR/consul-$CONSUL_PORT/pid" consul consul_ok || rc=1
	return $rc
}

cmd_env() {
	local v val
	for v in "${ENV_VARS[@]}"; do
		val=$(envval "$v")
		# Single quotes, so the DSNs' ( ) ? & survive eval in any POSIX shell.
		printf "export %s='%s'\n" "$v" "${val//\'/\'\\\'\'}"
	done
}

# cmd_bin NAME: what the other suites start their own etcd or consul from,
# so that they run the servers `up` runs without knowing where they are
# built; etcd-data names a member's data directory for them the same way.
# Only the path goes to stdout.
cmd_bin() {
	case ${1:-} in
	etcd) install_etcd >&2 && printf '%s\n' "$ETCD_BIN" ;;
	consul) install_consul >&2 && printf '%s\n' "$CONSUL_BIN" ;;
	*) die "bin: etcd or consul, not '${1:-}'" ;;
	esac
}

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status || exit 1 ;;
env) cmd_env ;;
clean) cmd_clean ;;
bin) cmd_bin "${2:-}" ;;
etcd-data)
	[[ -n ${2:-} ]] || die "etcd-data: name the member's directory"
	install_etcd >&2
	etcd_data_dir "$2"
	;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
