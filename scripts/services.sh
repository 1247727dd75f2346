#!/usr/bin/env bash
# services.sh up|down|env|jars|registry-dist — local Kafka (KRaft, one node), PostgreSQL and a schema
# registry for idem's development and tests, without Docker when no engine runs.
#
#   up    start what is missing and print KAFKA_BROKERS=…, DATABASE_URL=… and
#         SCHEMA_REGISTRY_URL=…; idempotent.
#         Values already set in the environment win: then that service is not started.
#         With a healthy Docker engine: `docker compose up -d --wait kafka postgres`.
#         Otherwise: Apache Kafka from Maven Central jars run with java, and the
#         machine's PostgreSQL cluster (pg_ctlcluster, as root) or an initdb'd one
#         under .state/pg (not root).
#   jars  fetch Kafka's jars into .state/kafka/libs (what `up` does before it starts a
#         broker) and start nothing: for the tests of this script in a checkout that
#         reuses another one's broker.
#   registry-dist  likewise for the schema registry's distribution (.state/registry/dist).
#   down  stop what `up` started (also after a crash); CLEAN=1 also deletes the state.
#         Services this checkout reused (below) are left running, and `down` says so.
#
# Reuse: when this checkout has not started a service and its port is taken by one
# that works (another checkout's `make services`, a compose stack, a system cluster),
# `up` reuses it, says so, and writes .state/services.env pointing at it:
#   Kafka       a broker on 127.0.0.1:KAFKA_PORT that answers a metadata request
#               with a broker and a controller (one broker only, not KAFKA_NODES=3);
#   PostgreSQL  a server on 127.0.0.1:PGPORT (unset: 5432, then 5433 when not root)
#               that accepts user idem, password idem, database idem.
#   Registry    a server on 127.0.0.1:REGISTRY_PORT whose Confluent-compatible API
#               answers GET /apis/ccompat/v7/subjects.
# Anything else on those ports is an error naming the port and its process.
#
# Schema registry: Apicurio Registry (REGISTRY_VERSION, 3.0.9: the newest built for
# Java 17) from its Maven Central distribution (io.apicurio:apicurio-registry-app, the
# -all.tar.gz), run with java and in-memory storage on 127.0.0.1:REGISTRY_PORT (8081),
# heap REGISTRY_HEAP (256m); its Confluent-compatible API is SCHEMA_REGISTRY_URL,
# http://127.0.0.1:8081/apis/ccompat/v7. It is started first and waited for last, so
# its start-up (5 s idle) overlaps Kafka's. Schemas live in memory: a restart forgets
# them (tests register their own). Always from the jars, also when Docker runs the others.
# SCHEMA_REGISTRY_URL set in the environment: no registry is started.
#
# Knobs: KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (9093), PGPORT (5432 as root via
# pg_ctlcluster, 5433 for the initdb cluster), IDEM_STATE (.state), KAFKA_HEAP (512m), KAFKA_READY_TIMEOUT (300s),
# KAFKA_NODES (1), REGISTRY_PORT (8081), REGISTRY_HEAP (256m), REGISTRY_VERSION (3.0.9).
#
# KAFKA_NODES=3 starts a three-node cluster instead of the one broker (always from the
# jars, never Docker): node n (1…3) is a combined broker+controller with node.id n,
# broker port KAFKA_PORT+2(n-1) and controller port KAFKA_CONTROLLER_PORT+2(n-1)
# (9092/9093, 9094/9095, 9096/9097 by default), a 3-voter quorum, replication factor 3
# for new topics and the internal ones, min.insync.replicas=2. Its state is under
# IDEM_STATE/kafka3/n<n>; `up` starts the nodes that are not running (also one that was
# killed) and waits until every node's own metadata lists all three brokers. `down`
# stops both layouts, whichever runs.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state=${IDEM_STATE:-$root/.state}
envfile=$state/services.env
kport=${KAFKA_PORT:-9092}
# How long a started broker may take to answer. A healthy one answers in
# seconds; on a machine at load 30 a restarted one took over 2 minutes
# (loading its transaction state), and the probe stops at once when the
# broker's process dies, so a long bound only delays the report of a broker
# that runs but never answers.
ready_timeout=${KAFKA_READY_TIMEOUT:-300s}
cport=${KAFKA_CONTROLLER_PORT:-9093}
kdir=$state/kafka
nodes=${KAFKA_NODES:-1}
kdir3=$state/kafka3
rport=${REGISTRY_PORT:-8081}
rdir=$state/registry
rversion=${REGISTRY_VERSION:-3.0.9}

die() { echo "services: $*" >&2; exit 1; }
note() { echo "services: $*" >&2; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# port_owner PORT names the process listening on PORT as "name, pid N", or
# "another process" when ss cannot tell (not root, or no ss).
port_owner() {
  local o; o=$(ss -ltnpH "sport = :$1" 2>/dev/null | sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\).*/\1, pid \2/p' | head -n1)
  echo "${o:-another process}"
}
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
# stop PID WHAT: SIGTERM, up to 20 s, then SIGKILL; says "WHAT stopped" if it ran.
stop() {
  alive "$1" || return 0
  kill "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do alive "$1" || break; sleep 0.2; done
  alive "$1" && kill -9 "$1" 2>/dev/null || true
  note "$2 stopped"
}

docker_up() {
  command -v docker >/dev/null 2>&1 || return 1
  timeout 5 docker info >/dev/null 2>&1
}

# ---------------------------------------------------------------- Kafka ----
kafka_pid() { [ -f "$kdir/kafka.pid" ] && cat "$kdir/kafka.pid" || true; }

kafka_libs() {
  command -v java >/dev/null 2>&1 || die "java not found: install Java 17 (apt-get install openjdk-17-jre-headless) or start a Docker engine"
  java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || die "Java 17 or newer is needed for Kafka 4 (found: $(java -version 2>&1 | head -n1)); set PATH/JAVA_HOME to a newer JDK"
  local stamp; stamp=$(sha256sum "$root/tools/kafka/pom.xml" | cut -c1-16)
  if [ -f "$kdir/libs/.stamp" ] && [ "$(cat "$kdir/libs/.stamp")" = "$stamp" ]; then return; fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (apt-get install maven) so the Kafka jars can be fetched, or start a Docker engine"
  note "fetching Kafka jars from Maven Central (first run only)…"
  rm -rf "$kdir/libs"; mkdir -p "$kdir/libs"
  if ! mvn -q -B -f "$root/tools/kafka/pom.xml" dependency:copy-dependencies -DoutputDirectory="$kdir/libs" >"$kdir/mvn.log" 2>&1; then
    die "mvn could not resolve the Kafka jars (see $kdir/mvn.log: $(grep -m1 ERROR "$kdir/mvn.log" || tail -n1 "$kdir/mvn.log"))"
  fi
  echo "$stamp" >"$kdir/libs/.stamp"
}

kafka_config() {
  mkdir -p "$kdir/data"
  cat >"$kdir/server.properties" <<CFG
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$kport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$kport
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$kdir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.hours=24
CFG
  log4j_config "$kdir"
}

# log4j_config DIR writes DIR/log4j2.properties: the broker logs to DIR/server.log.
log4j_config() {
  cat >"$1/log4j2.properties" <<CFG
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $1/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
CFG
}

kafka_up() {
  mkdir -p "$kdir"
  local pid; pid=$(kafka_pid)
  if alive "$pid"; then
    "$(readyprobe)" -brokers "127.0.0.1:$kport" -timeout "$ready_timeout" -pid "$pid" || die "the Kafka broker (pid $pid) runs but does not answer; run 'make services-down' and try again"
    return
  fi
  [ -f "$kdir/kafka.pid" ] && { note "removing stale pid file (broker $pid is not running)"; rm -f "$kdir/kafka.pid"; }
  if port_busy "$kport"; then die "port $kport is already in use by $(port_owner "$kport"), which does not answer as a Kafka broker; stop it or set KAFKA_PORT to a free port"; fi
  if port_busy "$cport"; then die "port $cport (Kafka controller) is already in use by $(port_owner "$cport" || echo 'another process'); stop it or set KAFKA_CONTROLLER_PORT"; fi
  kafka_libs
  kafka_config
  local cp="$kdir/libs/*"
  if [ ! -f "$kdir/cluster.id" ]; then
    if [ -n "$(ls -A "$kdir/data" 2>/dev/null)" ]; then
      die "stale Kafka state in $kdir/data (no cluster.id beside it); run 'make services-down CLEAN=1' and try again"
    fi
    java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 >"$kdir/cluster.id.tmp" || die "kafka StorageTool random-uuid failed"
    mv "$kdir/cluster.id.tmp" "$kdir/cluster.id"
  fi
  local cid; cid=$(cat "$kdir/cluster.id")
  if [ -f "$kdir/data/meta.properties" ] && ! grep -q "cluster.id=$cid" "$kdir/data/meta.properties"; then
    die "stale Kafka state in $kdir/data (cluster id differs from $kdir/cluster.id); run 'make services-down CLEAN=1' and try again"
  fi
  if ! java -Dlog4j2.configurationFile="$kdir/log4j2.properties" -cp "$cp" kafka.tools.StorageTool format \
      -t "$cid" -c "$kdir/server.properties" --ignore-formatted >"$kdir/format.log" 2>&1; then
    die "formatting Kafka storage failed: $(grep -m1 -iE 'error|exception' "$kdir/format.log" || tail -n1 "$kdir/format.log"); if the state is stale run 'make services-down CLEAN=1'"
  fi
  note "starting Kafka $(ls "$kdir/libs" | sed -n 's/^kafka_2.13-\(.*\)\.jar$/\1/p') on 127.0.0.1:$kport (log: $kdir/server.log)"
  setsid nohup java -Xms512m -Xmx"${KAFKA_HEAP:-512m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$kdir/log4j2.properties" -Dkafka.logs.dir="$kdir" \
    -cp "$cp" kafka.Kafka "$kdir/server.properties" >"$kdir/kafka.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$kdir/kafka.pid"
  if ! "$(readyprobe)" -brokers "127.0.0.1:$kport" -timeout "$ready_timeout" -pid "$pid"; then
    local why; why=$(grep -m1 -E 'ERROR|Exception' "$kdir/server.log" "$kdir/kafka.out" 2>/dev/null | head -n1 || true)
    kill "$pid" 2>/dev/null || true; rm -f "$kdir/kafka.pid"
    die "Kafka did not become ready${why:+: $why} (logs: $kdir/server.log, $kdir/kafka.out)"
  fi
}

readyprobe() {
  local bin=$state/bin/kafkaready
  if [ ! -x "$bin" ] || [ "$root/internal/testing/tools/kafkaready/main.go" -nt "$bin" ]; then
    command -v go >/dev/null 2>&1 || die "go not found: install Go 1.26"
    mkdir -p "$state/bin"
    (cd "$root" && go build -o "$bin" ./internal/testing/tools/kafkaready) >&2 || die "could not build the readiness probe (internal/testing/tools/kafkaready)"
  fi
  echo "$bin"
}

# kafka_reusable: no broker of this checkout runs, and a working one already
# listens on KAFKA_PORT (started by another checkout or by hand).
kafka_reusable() {
  alive "$(kafka_pid)" && return 1
  port_busy "$kport" || return 1
  # This checkout's own broker whose pid file was lost (a crash of this script) is not reused: it is adopted.
  local own; own=$(pgrep -f "kafka.Kafka $kdir/server.properties" 2>/dev/null | head -n1 || true)
  if [ -n "$own" ]; then
    note "this checkout's broker runs without its pid file (pid $own): keeping it"
    mkdir -p "$kdir"; echo "$own" >"$kdir/kafka.pid"; return 1
  fi
  "$(readyprobe)" -brokers "127.0.0.1:$kport" -timeout 5s 2>/dev/null
}

kafka_down() {
  stop "$(kafka_pid)" Kafka
  rm -f "$kdir/kafka.pid"
  # A broker left behind by a crash of this script (pid file lost) is found by its config path.
  pkill -f "kafka.Kafka $kdir/server.properties" 2>/dev/null || true
}

# ------------------------------------------------- Kafka, three nodes ----
node_port() { echo $((kport + 2 * ($1 - 1))); }
node_cport() { echo $((cport + 2 * ($1 - 1))); }
node_pid() { [ -f "$kdir3/n$1/kafka.pid" ] && cat "$kdir3/n$1/kafka.pid" || true; }
# A SIGKILLed node is a zombie until init reaps it: not alive.
node_alive() { alive "$1" && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; }
kafka3_brokers() { echo "127.0.0.1:$(node_port 1),127.0.0.1:$(node_port 2),127.0.0.1:$(node_port 3)"; }

kafka3_config() {
  local n=$1 nd=$kdir3/n$1
  local voters="1@127.0.0.1:$(node_cport 1),2@127.0.0.1:$(node_cport 2),3@127.0.0.1:$(node_cport 3)"
  mkdir -p "$nd/data"
  cat >"$nd/server.properties" <<CFG
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(node_port "$n"),CONTROLLER://127.0.0.1:$(node_cport "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(node_port "$n")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$nd/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.hours=24
CFG
  log4j_config "$nd"
}

# kafka3_up starts every node that is not running and waits until each node's
# own metadata lists all three brokers (so the quorum has a leader: a broker is
# listed only once the active controller has registered and unfenced it).
kafka3_up() {
  mkdir -p "$kdir3"
  local n pid start="" pids=""
  for n in 1 2 3; do
    pid=$(node_pid "$n")
    if node_alive "$pid"; then pids="$pids,$pid"; continue; fi
    if [ -f "$kdir3/n$n/kafka.pid" ]; then
      note "removing stale pid file (node $n, pid $pid, is not running)"; rm -f "$kdir3/n$n/kafka.pid"
      # A node just killed may hold its ports until its last thread is gone.
      for _ in $(seq 1 50); do port_busy "$(node_port "$n")" || port_busy "$(node_cport "$n")" || break; sleep 0.2; done
    fi
    if port_busy "$(node_port "$n")"; then die "port $(node_port "$n") (Kafka node $n) is already in use by $(port_owner "$(node_port "$n")" || echo 'another process'); stop it or set KAFKA_PORT to a free range"; fi
    if port_busy "$(node_cport "$n")"; then die "port $(node_cport "$n") (Kafka node $n's controller) is already in use by $(port_owner "$(node_cport "$n")" || echo 'another process'); stop it or set KAFKA_CONTROLLER_PORT"; fi
    start="$start $n"
  done
  if [ -n "$start" ]; then
    kafka_libs
    local cp="$kdir/libs/*"
    if [ ! -f "$kdir3/cluster.id" ]; then
      if [ -n "$(ls -A "$kdir3"/n*/data 2>/dev/null)" ]; then
        die "stale Kafka state in $kdir3 (no cluster.id beside it); run 'make services-down CLEAN=1' and try again"
      fi
      java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 >"$kdir3/cluster.id.tmp" || die "kafka StorageTool random-uuid failed"
      mv "$kdir3/cluster.id.tmp" "$kdir3/cluster.id"
    fi
    local cid; cid=$(cat "$kdir3/cluster.id")
    for n in $start; do
      local nd=$kdir3/n$n
      kafka3_config "$n"
      if [ -f "$nd/data/meta.properties" ] && ! grep -q "cluster.id=$cid" "$nd/data/meta.properties"; then
        die "stale Kafka state in $nd/data (cluster id differs from $kdir3/cluster.id); run 'make services-down CLEAN=1' and try again"
      fi
      if ! java -Dlog4j2.configurationFile="$nd/log4j2.properties" -cp "$cp" kafka.tools.StorageTool format \
          -t "$cid" -c "$nd/server.properties" --ignore-formatted >"$nd/format.log" 2>&1; then
        die "formatting Kafka node $n's storage failed: $(grep -m1 -iE 'error|exception' "$nd/format.log" || tail -n1 "$nd/format.log"); if the state is stale run 'make services-down CLEAN=1'"
      fi
      note "starting Kafka node $n on 127.0.0.1:$(node_port "$n") (controller $(node_cport "$n"); log: $nd/server.log)"
      setsid nohup java -Xms256m -Xmx"${KAFKA_HEAP:-512m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$nd/log4j2.properties" -Dkafka.logs.dir="$nd" \
        -cp "$cp" kafka.Kafka "$nd/server.properties" >"$nd/kafka.out" 2>&1 </dev/null &
      pid=$!
      echo "$pid" >"$nd/kafka.pid"
      pids="$pids,$pid"
    done
  fi
  if ! "$(readyprobe)" -brokers "$(kafka3_brokers)" -want-brokers 3 -timeout "$ready_timeout" -pid "${pids#,}"; then
    local why; why=$(grep -h -m1 -E '\] (ERROR|FATAL) ' "$kdir3"/n*/server.log "$kdir3"/n*/kafka.out 2>/dev/null | head -n1 || true)
    die "the three-node Kafka cluster did not become ready${why:+: $why} (logs: $kdir3/n*/server.log; 'make services-down' stops it)"
  fi
}

kafka3_down() {
  [ -d "$kdir3" ] || return 0
  local n pid any=""
  for n in 1 2 3; do
    pid=$(node_pid "$n")
    # SIGCONT too: a node frozen by a chaos run handles SIGTERM only once resumed.
    if alive "$pid"; then kill "$pid" 2>/dev/null || true; kill -CONT "$pid" 2>/dev/null || true; any=1; fi
  done
  for n in 1 2 3; do
    pid=$(node_pid "$n")
    # The last node of a quorum may wait for a controlled shutdown that cannot
    # happen any more: give each 20 s, then SIGKILL.
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.2; done
    alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    rm -f "$kdir3/n$n/kafka.pid"
    pkill -f "kafka.Kafka $kdir3/n$n/server.properties" 2>/dev/null || true
  done
  [ -n "$any" ] && note "Kafka cluster (3 nodes) stopped"
  return 0
}

# ----------------------------------------------------------- PostgreSQL ----
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1; }

pg_up() {
  local bin; bin=$(pg_bin)
  if [ "$(id -u)" = 0 ] && command -v pg_ctlcluster >/dev/null 2>&1; then
    local line; line=$(pg_lsclusters -h 2>/dev/null | sort -V | tail -n1)
    if [ -z "$line" ]; then
      local v; v=$(basename "$(dirname "$bin")")
      [ -n "$v" ] || die "PostgreSQL server not installed: apt-get install postgresql"
      pg_createcluster "$v" main >/dev/null || die "pg_createcluster $v main failed"
      line=$(pg_lsclusters -h | sort -V | tail -n1)
    fi
    read -r ver name port status _ <<<"$line"
    if [ "$status" != online ]; then
      if port_busy "$port"; then die "port $port is already in use by $(port_owner "$port"), which does not accept PostgreSQL user idem (password idem, database idem); PostgreSQL $ver/$name cannot start there"; fi
      timeout 60 pg_ctlcluster "$ver" "$name" start || die "pg_ctlcluster $ver $name start failed (see /var/log/postgresql/postgresql-$ver-$name.log)"
      echo "$ver $name" >"$state/pg.started"
    fi
    local sql="DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='idem') THEN CREATE ROLE idem LOGIN SUPERUSER PASSWORD 'idem'; END IF; END\$\$;"
    timeout 30 su postgres -c "psql -p $port -qAt -v ON_ERROR_STOP=1" <<<"$sql" >/dev/null || die "could not create role idem in PostgreSQL $ver/$name"
    if ! timeout 30 su postgres -c "psql -p $port -qAtc \"SELECT 1 FROM pg_database WHERE datname='idem'\"" | grep -q 1; then
      timeout 30 su postgres -c "createdb -p $port -O idem idem" || die "could not create database idem"
    fi
    DATABASE_URL="postgres://idem:idem@127.0.0.1:$port/idem?sslmode=disable"
    return
  fi
  # Not root: a private cluster under the state folder.
  [ -n "$bin" ] || die "PostgreSQL server not installed: install postgresql (Debian: apt-get install postgresql) or start a Docker engine"
  local port=${PGPORT:-5433} pgd=$state/pg
  if [ -f "$pgd/data/PG_VERSION" ] && "$bin/pg_ctl" -D "$pgd/data" status >/dev/null 2>&1; then :; else
    if [ ! -f "$pgd/data/PG_VERSION" ]; then
      rm -rf "$pgd"; mkdir -p "$pgd"
      "$bin/initdb" -D "$pgd/data" -U idem --auth=trust >"$pgd/initdb.log" 2>&1 || die "initdb failed (see $pgd/initdb.log)"
    fi
    if port_busy "$port"; then die "port $port is already in use by $(port_owner "$port"), which does not accept PostgreSQL user idem (password idem, database idem); stop it or set PGPORT to a free port"; fi
    rm -f "$pgd/data/postmaster.pid"
    "$bin/pg_ctl" -D "$pgd/data" -l "$pgd/server.log" -w -t 60 -o "-p $port -k $pgd -c listen_addresses=127.0.0.1" start >/dev/null ||
      die "PostgreSQL did not start (see $pgd/server.log)"
    echo "local" >"$state/pg.started"
  fi
  "$bin/psql" -h 127.0.0.1 -p "$port" -U idem -d postgres -qAtc "SELECT 1 FROM pg_database WHERE datname='idem'" | grep -q 1 ||
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U idem idem || die "could not create database idem"
  DATABASE_URL="postgres://idem@127.0.0.1:$port/idem?sslmode=disable"
}

# pg_reusable: this checkout has not started PostgreSQL, and a server on PGPORT
# (unset: 5432, then 5433 when not root) accepts idem's credentials; prints its port.
pg_reusable() {
  [ -f "$state/pg.started" ] && return 1
  local psql; psql=$(command -v psql || echo "$(pg_bin)/psql")
  [ -x "$psql" ] || return 1
  local ports=${PGPORT:-5432}
  [ -z "${PGPORT:-}" ] && [ "$(id -u)" != 0 ] && ports="5432 5433"
  local p
  for p in $ports; do
    port_busy "$p" || continue
    if PGPASSWORD=idem PGCONNECT_TIMEOUT=5 "$psql" -h 127.0.0.1 -p "$p" -U idem -d idem -w -qAtc 'SELECT 1' 2>/dev/null | grep -qx 1; then
      echo "$p"; return 0
    fi
  done
  return 1
}

pg_down() {
  [ -f "$state/pg.started" ] || return 0
  local how; how=$(cat "$state/pg.started")
  if [ "$how" = local ]; then
    "$(pg_bin)/pg_ctl" -D "$state/pg/data" -m fast -w stop >/dev/null 2>&1 || true
  else
    # shellcheck disable=SC2086
    pg_ctlcluster $how stop 2>/dev/null || true
  fi
  rm -f "$state/pg.started"
  note "PostgreSQL stopped"
}

# ------------------------------------------------------ schema registry ----
registry_pid() { [ -f "$rdir/registry.pid" ] && cat "$rdir/registry.pid" || true; }
registry_url() { echo "http://127.0.0.1:$1/apis/ccompat/v7"; }

# registry_answers PORT: a Confluent-compatible registry answers on PORT (its
# subject list is a JSON array). Plain bash, so no curl is needed.
registry_answers() {
  local reply
  reply=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "GET /apis/ccompat/v7/subjects HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n" >&3
    cat <&3' _ "$1" 2>/dev/null) || return 1
  [[ $reply == "HTTP/1."?" 200"* ]] && [[ $reply == *$'\r\n\r\n['* ]]
}

# registry_dist fetches and unpacks Apicurio Registry's distribution into
# $rdir/dist once per REGISTRY_VERSION. maven-dependency-plugin 2.8's get with
# -Ddest copies the archive without reading its parent POM (not on Maven Central).
registry_dist() {
  if [ -f "$rdir/dist/.stamp" ] && [ "$(cat "$rdir/dist/.stamp")" = "$rversion" ]; then return; fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (apt-get install maven) so the schema registry can be fetched"
  note "fetching Apicurio Registry $rversion from Maven Central (first run only)…"
  rm -rf "$rdir/dist"; mkdir -p "$rdir/dist"
  if ! mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:2.8:get -Dtransitive=false \
      -Dartifact="io.apicurio:apicurio-registry-app:$rversion:tar.gz:all" -Ddest="$rdir/app.tar.gz" >"$rdir/mvn.log" 2>&1; then
    die "mvn could not fetch Apicurio Registry $rversion (see $rdir/mvn.log: $(grep -m1 ERROR "$rdir/mvn.log" || tail -n1 "$rdir/mvn.log"))"
  fi
  tar xzf "$rdir/app.tar.gz" -C "$rdir/dist" || die "could not unpack $rdir/app.tar.gz"
  rm -f "$rdir/app.tar.gz"
  echo "$rversion" >"$rdir/dist/.stamp"
}

# registry_start starts this checkout's registry unless it runs; registry_wait
# (called once Kafka and PostgreSQL are up) waits until it answers.
registry_start() {
  mkdir -p "$rdir"
  local pid; pid=$(registry_pid)
  alive "$pid" && return
  [ -f "$rdir/registry.pid" ] && { note "removing stale pid file (registry $pid is not running)"; rm -f "$rdir/registry.pid"; }
  if port_busy "$rport"; then die "port $rport is already in use by $(port_owner "$rport"), which does not answer as a schema registry; stop it or set REGISTRY_PORT to a free port"; fi
  command -v java >/dev/null 2>&1 || die "java not found: install Java 17 (apt-get install openjdk-17-jre-headless)"
  registry_dist
  local jar; jar=$(ls "$rdir"/dist/*-runner.jar 2>/dev/null | head -n1)
  [ -n "$jar" ] || die "no runner jar in $rdir/dist; run 'make services-down CLEAN=1' and try again"
  note "starting Apicurio Registry $rversion on 127.0.0.1:$rport (log: $rdir/registry.log)"
  # Serial GC, C1 only and a small heap: it starts in about 5 s and stays near 250 MB.
  setsid nohup java -Xms64m -Xmx"${REGISTRY_HEAP:-256m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$rport" -Dquarkus.http.access-log.enabled=false \
    -Dapicurio.rest.deletion.artifact.enabled=true -Dapicurio.rest.deletion.artifact-version.enabled=true \
    -jar "$jar" >"$rdir/registry.log" 2>&1 </dev/null &
  echo $! >"$rdir/registry.pid"
}

registry_wait() {
  local pid; pid=$(registry_pid)
  for _ in $(seq 1 600); do
    registry_answers "$rport" && return
    alive "$pid" || break
    sleep 0.2
  done
  local why; why=$(grep -m1 -E 'ERROR|Exception' "$rdir/registry.log" 2>/dev/null || true)
  alive "$pid" && kill "$pid" 2>/dev/null || true
  rm -f "$rdir/registry.pid"
  die "the schema registry did not become ready${why:+: $why} (log: $rdir/registry.log)"
}

# registry_reusable: no registry of this checkout runs, and one answers on REGISTRY_PORT.
registry_reusable() {
  alive "$(registry_pid)" && return 1
  port_busy "$rport" || return 1
  local own; own=$(pgrep -f -- "-Dquarkus.http.port=$rport .*$rdir/dist/" 2>/dev/null | head -n1 || true)
  if [ -n "$own" ]; then
    note "this checkout's registry runs without its pid file (pid $own): keeping it"
    mkdir -p "$rdir"; echo "$own" >"$rdir/registry.pid"; return 1
  fi
  registry_answers "$rport"
}

registry_down() {
  stop "$(registry_pid)" "schema registry"
  rm -f "$rdir/registry.pid"
}

# ------------------------------------------------------------------ main ----
cmd=${1:-up}
mkdir -p "$state"
case "$cmd" in
up)
  case "$nodes" in 1|3) ;; *) die "KAFKA_NODES=$nodes: want 1 (one broker) or 3 (a three-node cluster)" ;; esac
  kafka_set=${KAFKA_BROKERS:-}; db_set=${DATABASE_URL:-}; reg_set=${SCHEMA_REGISTRY_URL:-}
  rm -f "$state/kafka.reused" "$state/pg.reused" "$state/registry.reused"
  # The registry starts first and is waited for last: its start-up overlaps the others'.
  if [ -z "$reg_set" ] && registry_reusable; then
    SCHEMA_REGISTRY_URL=$(registry_url "$rport"); reg_set=$SCHEMA_REGISTRY_URL
    echo "$SCHEMA_REGISTRY_URL" >"$state/registry.reused"
    note "reusing the schema registry already at $SCHEMA_REGISTRY_URL (served by $(port_owner "$rport")): not started by this checkout, so 'make services-down' here leaves it running"
  elif [ -z "$reg_set" ]; then
    registry_start
  fi
  # Services another checkout started (or the machine runs) are reused, not started again.
  if [ "$nodes" = 1 ] && [ -z "$kafka_set" ] && [ ! -f "$state/docker.started" ] && kafka_reusable; then
    KAFKA_BROKERS=127.0.0.1:$kport; kafka_set=$KAFKA_BROKERS
    echo "$KAFKA_BROKERS" >"$state/kafka.reused"
    note "reusing the Kafka broker already at $KAFKA_BROKERS (served by $(port_owner "$kport")): not started by this checkout, so 'make services-down' here leaves it running"
  fi
  if [ -z "$db_set" ] && [ ! -f "$state/docker.started" ] && pgp=$(pg_reusable); then
    DATABASE_URL="postgres://idem:idem@127.0.0.1:$pgp/idem?sslmode=disable"; db_set=$DATABASE_URL
    echo "$DATABASE_URL" >"$state/pg.reused"
    note "reusing the PostgreSQL already at 127.0.0.1:$pgp (served by $(port_owner "$pgp"), accepts user idem): not started by this checkout, so 'make services-down' here leaves it running"
  fi
  if [ "$nodes" = 3 ] && [ -z "$kafka_set" ]; then
    kafka3_up; KAFKA_BROKERS=$(kafka3_brokers); kafka_set=$KAFKA_BROKERS
  fi
  if [ -z "$kafka_set" ] || [ -z "$db_set" ]; then
    if [ "${IDEM_NO_DOCKER:-}" != 1 ] && docker_up; then
      svcs=""; [ -z "$kafka_set" ] && svcs="$svcs kafka"; [ -z "$db_set" ] && svcs="$svcs postgres"
      # shellcheck disable=SC2086
      (cd "$root" && docker compose up -d --wait $svcs) >&2 || die "docker compose up failed"
      echo docker >"$state/docker.started"
      [ -z "$kafka_set" ] && KAFKA_BROKERS=127.0.0.1:9092
      [ -z "$db_set" ] && DATABASE_URL="postgres://idem:idem@127.0.0.1:5432/idem?sslmode=disable"
    else
      [ -z "$kafka_set" ] && { kafka_up; KAFKA_BROKERS=127.0.0.1:$kport; }
      [ -z "$db_set" ] && pg_up
    fi
  fi
  if [ -z "$reg_set" ]; then registry_wait; SCHEMA_REGISTRY_URL=$(registry_url "$rport"); fi
  printf 'KAFKA_BROKERS=%s\nDATABASE_URL=%s\nSCHEMA_REGISTRY_URL=%s\n' "$KAFKA_BROKERS" "$DATABASE_URL" "$SCHEMA_REGISTRY_URL" | tee "$envfile"
  ;;
down)
  if [ -f "$state/kafka.reused" ]; then
    note "Kafka at $(cat "$state/kafka.reused") was not started by this checkout: left running (stop it from the checkout that started it)"
    rm -f "$state/kafka.reused"
  fi
  if [ -f "$state/pg.reused" ]; then
    note "PostgreSQL at $(sed 's|.*@||; s|/.*||' "$state/pg.reused") was not started by this checkout: left running (stop it from the checkout that started it)"
    rm -f "$state/pg.reused"
  fi
  if [ -f "$state/registry.reused" ]; then
    note "the schema registry at $(cat "$state/registry.reused") was not started by this checkout: left running (stop it from the checkout that started it)"
    rm -f "$state/registry.reused"
  fi
  if [ -f "$state/docker.started" ]; then
    (cd "$root" && docker compose down) >&2 || true
    rm -f "$state/docker.started"
  fi
  kafka_down
  kafka3_down
  registry_down
  pg_down
  rm -f "$envfile"
  if [ "${CLEAN:-}" = 1 ]; then rm -rf "$kdir" "$kdir3" "$state/pg" "$rdir"; note "state deleted"; fi
  ;;
env) cat "$envfile" 2>/dev/null || die "no $envfile: run 'make services'" ;;
jars) kafka_libs ;;
registry-dist) registry_dist ;;
*) die "usage: services.sh up|down|env|jars|registry-dist" ;;
esac
