#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft, combined broker+controller) for streamdedup.
#
#   deploy/local/kafka.sh install          resolve the broker jars into deploy/local/lib (Maven, once)
#   deploy/local/kafka.sh start [--keep]   start an instance (fresh data dir unless --keep / KAFKA_KEEP_DATA=1)
#   deploy/local/kafka.sh stop             SIGTERM our broker, SIGKILL after KAFKA_STOP_TIMEOUT seconds
#   deploy/local/kafka.sh status [--all]   running or not, with its listeners (exit 0 running, 3 not running)
#   deploy/local/kafka.sh logs [-f] [N]    last N (200) lines of the broker log, -f to follow
#   deploy/local/kafka.sh clean            remove the run directory of a stopped instance
#
# Environment (defaults in brackets):
#   KAFKA_NAME [default]           instance name; state lives in deploy/local/run/<name>/
#   KAFKA_PORT [9092]              PLAINTEXT listener on 127.0.0.1 (the bootstrap address)
#   KAFKA_CONTROLLER_PORT [9093]   KRaft CONTROLLER listener on 127.0.0.1
#   KAFKA_SASL_PORT [9094]         SASL_PLAINTEXT listener (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN)
#   KAFKA_SSL_PORT [9095]          SSL listener (TLS with a CA and broker certificate made at start)
#   KAFKA_SASL_SSL_PORT [9096]     SASL_SSL listener (TLS + the SASL mechanisms above)
#   KAFKA_SSL_EXPIRED_PORT [9097]  SSL listener presenting an *expired* certificate (tests of TLS failures)
#   KAFKA_SASL_USER [streamdedup]  KAFKA_SASL_PASSWORD [streamdedup-secret]
#   KAFKA_HEAP [-Xmx512m]          heap options, or just a size such as 1g
#   KAFKA_JVM_OPTS                 replaces the default GC/startup JVM flags; KAFKA_OPTS is appended
#   KAFKA_START_TIMEOUT [60]       seconds to wait for "Kafka Server started"
#   KAFKA_STOP_TIMEOUT [30]        seconds to wait after SIGTERM before SIGKILL
#   KAFKA_KEEP_DATA [0]            1: keep the existing data dir (and its SCRAM users) on start
#   KAFKA_WATCH_PID                if set on start: stop the broker when that process exits (test runs)
#   KAFKA_FORMAT_CACHE [1]         0: run kafka-storage format on every fresh start instead of copying a template
#   KAFKA_OFFSETS_PARTITIONS [1]   partitions of __consumer_offsets / __transaction_state
#   KAFKA_CDS [1]                  0: no class-data sharing archive (run/.cds/, made by the first clean stop)
#   KAFKA_VERSION                  override the Kafka version of pom.xml (must be set for every command)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$HERE/lib"
RUN_ROOT="$HERE/run"
STAMP="$LIB/.installed"

KAFKA_NAME="${KAFKA_NAME:-default}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_SASL_PORT="${KAFKA_SASL_PORT:-9094}"
KAFKA_SSL_PORT="${KAFKA_SSL_PORT:-9095}"
KAFKA_SASL_SSL_PORT="${KAFKA_SASL_SSL_PORT:-9096}"
KAFKA_SSL_EXPIRED_PORT="${KAFKA_SSL_EXPIRED_PORT:-9097}"
KAFKA_SASL_USER="${KAFKA_SASL_USER:-streamdedup}"
KAFKA_SASL_PASSWORD="${KAFKA_SASL_PASSWORD:-streamdedup-secret}"
KAFKA_HEAP="${KAFKA_HEAP:--Xmx512m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-60}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
KAFKA_KEEP_DATA="${KAFKA_KEEP_DATA:-0}"
KAFKA_VERSION="${KAFKA_VERSION:-}"
# Fast startup for a short-lived dev broker: serial GC (no G1 region setup, 2 cores),
# C1-heavy tiering is NOT used because benchmarks run against this broker too.
KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS:--XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true}"
KAFKA_OPTS="${KAFKA_OPTS:-}"

RUN_DIR="$RUN_ROOT/$KAFKA_NAME"
PID_FILE="$RUN_DIR/kafka.pid"
WATCHDOG_PID_FILE="$RUN_DIR/watchdog.pid"
LOG_FILE="$RUN_DIR/kafka.log"
DATA_DIR="$RUN_DIR/data"
PROPS="$RUN_DIR/server.properties"
INSTANCE_ENV="$RUN_DIR/instance.env"
CDS_DIR="$RUN_ROOT/.cds"
CDS_RECORD="$RUN_DIR/classes.jsa"
TLS_DIR="$RUN_DIR/tls"
PORT_VARS=(KAFKA_PORT KAFKA_CONTROLLER_PORT KAFKA_SASL_PORT KAFKA_SSL_PORT KAFKA_SASL_SSL_PORT KAFKA_SSL_EXPIRED_PORT)
STARTED_PATTERN='Kafka Server started'

me="kafka.sh[$KAFKA_NAME]"
say() { printf '%s: %s\n' "$me" "$*"; }
err() { printf '%s: error: %s\n' "$me" "$*" >&2; }
die() { err "$@"; exit 1; }
now_ms() { date +%s%3N; }
elapsed() { local ms=$(( $(now_ms) - $1 )); printf '%d.%01d' $((ms / 1000)) $(((ms % 1000) / 100)); }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH ($2)"; }

check_name() {
    [[ "$KAFKA_NAME" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] \
        || die "KAFKA_NAME must match [A-Za-z0-9][A-Za-z0-9._-]* (got '$KAFKA_NAME')"
}

check_sasl() {
    # The user and password are spliced into the JAAS line and the --add-scram argument.
    [[ "$KAFKA_SASL_USER" =~ ^[A-Za-z0-9._-]+$ ]] \
        || die "KAFKA_SASL_USER must match [A-Za-z0-9._-]+ (got '$KAFKA_SASL_USER')"
    [[ -n "$KAFKA_SASL_PASSWORD" && "$KAFKA_SASL_PASSWORD" != *[\"\\,\;\]\[[:space:]]* ]] \
        || die "KAFKA_SASL_PASSWORD must be non-empty, without quotes, backslashes, commas, semicolons, brackets or spaces"
}

check_ports() {
    local v w
    for v in "${PORT_VARS[@]}"; do
        if ! [[ "${!v}" =~ ^[0-9]+$ ]] || (( ${!v} < 1 || ${!v} > 65535 )); then
            die "$v must be a TCP port (got '${!v}')"
        fi
    done
    for v in "${PORT_VARS[@]}"; do
        for w in "${PORT_VARS[@]}"; do
            if [[ "$v" < "$w" ]] && (( ${!v} == ${!w} )); then
                die "every port must differ: $v and $w are both ${!v}"
            fi
        done
    done
}

ports_string() {  # the instance's ports, a/b/c/..., in PORT_VARS order
    local v out=""
    for v in "${PORT_VARS[@]}"; do out+="${out:+/}${!v}"; done
    printf '%s\n' "$out"
}

# ----------------------------------------------------------------------------- install

install_key() {
    printf '%s kafka=%s\n' "$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1)" "${KAFKA_VERSION:-pom}"
}

lib_complete() {
    [[ -f "$STAMP" ]] || return 1
    [[ "$(head -n 1 "$STAMP")" == "$(install_key)" ]] || return 1
    local jar n=0
    while IFS= read -r jar; do
        [[ -f "$LIB/$jar" ]] || return 1
        n=$((n + 1))
    done < <(tail -n +2 "$STAMP")
    (( n > 0 ))
}

# The jars without which the broker or kafka-storage cannot start.
lib_has_essentials() {
    local dir="$1" ver="$2" pat
    missing_jars=""
    for pat in "kafka_2.13-$ver.jar" "kafka-clients-$ver.jar" "kafka-server-common-$ver.jar" \
            "kafka-metadata-$ver.jar" "kafka-raft-$ver.jar" "kafka-storage-$ver.jar" \
            "kafka-group-coordinator-$ver.jar" "kafka-server-$ver.jar" "scala-library-*.jar" \
            "argparse4j-*.jar" "jackson-databind-*.jar" "slf4j-api-*.jar" "slf4j-reload4j-*.jar" \
            "reload4j-*.jar"; do
        compgen -G "$dir/$pat" >/dev/null || missing_jars+=" $pat"
    done
    [[ -z "$missing_jars" ]]
}

installed_version() {
    local j
    for j in "$LIB"/kafka_2.13-*.jar; do
        [[ -f "$j" ]] || continue
        j="${j##*/kafka_2.13-}"; printf '%s\n' "${j%.jar}"; return 0
    done
    printf 'unknown\n'
}

cmd_install() {
    need java "install OpenJDK 17: apt-get install -y openjdk-17-jre-headless"
    mkdir -p "$RUN_ROOT"
    # Serialise concurrent installs (parallel test runs); the lock file lives in the gitignored run/.
    # A subshell, so that the lock's fd is not inherited by the broker started afterwards.
    ( flock 9; install_locked ) 9>"$RUN_ROOT/.install.lock"
}

install_locked() {
    if lib_complete; then
        say "jars up to date in deploy/local/lib (Kafka $(installed_version))"
        return 0
    fi
    need mvn "install Maven: apt-get install -y maven"
    local f p
    for f in "$RUN_ROOT"/*/kafka.pid; do
        [[ -f "$f" ]] || continue
        p="$(cat "$f" 2>/dev/null || true)"
        if [[ "$p" =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "$LIB/*"; then
            die "broker '$(basename "$(dirname "$f")")' (pid $p) runs from deploy/local/lib; stop it before replacing the jars"
        fi
    done
    local t0 tmp mvnlog ver mpid rc=0
    t0=$(now_ms)
    ver="${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml" | head -n 1)}"
    tmp="$RUN_ROOT/.lib-install.$$"
    mvnlog="$RUN_ROOT/.maven-install.log"
    rm -rf "$tmp"
    local args=(-B -q -f "$HERE/pom.xml" dependency:copy-dependencies "-DoutputDirectory=$tmp")
    [[ -n "$KAFKA_VERSION" ]] && args+=("-Dkafka.version=$KAFKA_VERSION")
    say "installing Apache Kafka $ver jars into deploy/local/lib with Maven (needs ~/.m2 or Maven Central) ..."
    # Offline first: after the first run everything is in ~/.m2. Offline Maven "succeeds" with an
    # incomplete classpath when a POM is missing from ~/.m2 (e.g. after `mvn dependency:get
    # -Dtransitive=false`), so the result is checked and the online run is the fallback.
    if mvn -o "${args[@]}" >"$mvnlog" 2>&1 && lib_has_essentials "$tmp" "$ver"; then
        say "  resolved from the local Maven cache (~/.m2), offline"
    else
        say "  not everything is in ~/.m2 yet: downloading from Maven Central (~45 MB, first run only) ..."
        rm -rf "$tmp"
        mvn "${args[@]}" >>"$mvnlog" 2>&1 &
        mpid=$!
        while kill -0 "$mpid" 2>/dev/null; do
            sleep 5
            kill -0 "$mpid" 2>/dev/null && say "  ... still downloading ($(elapsed "$t0") s)"
        done
        wait "$mpid" || rc=$?
        if (( rc != 0 )); then
            rm -rf "$tmp"
            err "Maven failed (exit $rc); last lines of $mvnlog:"
            tail -n 30 "$mvnlog" | sed 's/\x1b\[[0-9;]*m//g' >&2
            exit 1
        fi
    fi
    if ! lib_has_essentials "$tmp" "$ver"; then
        rm -rf "$tmp"
        err "Maven did not produce a complete Kafka $ver classpath (missing:$missing_jars); see $mvnlog"
        grep -i 'missing\|WARN\|ERROR' "$mvnlog" | sed 's/\x1b\[[0-9;]*m//g' | tail -n 10 >&2 || true
        exit 1
    fi
    { install_key; (cd "$tmp" && ls -1 -- *.jar); } >"$tmp/.installed"
    rm -rf "$LIB"
    mv "$tmp" "$LIB"
    say "installed $(($(wc -l <"$STAMP") - 1)) jars (Kafka $(installed_version), $(du -sh "$LIB" | cut -f1)) in $(elapsed "$t0") s"
}

ensure_installed() {
    lib_complete || cmd_install
}

# ----------------------------------------------------------------------------- process helpers

# Our broker: the pid from our pid file whose command line is kafka.Kafka with *our* server.properties.
is_our_broker() {
    local pid="$1" cmdline
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
    [[ "$cmdline" == *kafka.Kafka* && "$cmdline" == *"$PROPS"* ]]
}

running_pid() {
    local pid
    [[ -f "$PID_FILE" ]] || return 1
    pid="$(cat "$PID_FILE" 2>/dev/null)" || return 1
    is_our_broker "$pid" || return 1
    printf '%s\n' "$pid"
}

port_listener() {  # prints the ss line(s) of whatever listens on TCP port $1 (any address)
    ss -Hltnp "( sport = :$1 )" 2>/dev/null || true
}

port_in_use() {
    if command -v ss >/dev/null 2>&1; then
        [[ -n "$(port_listener "$1")" ]] && return 0
    fi
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

port_accepts() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

terminate() {  # terminate <pid> <timeout>: SIGTERM, wait, SIGKILL (then sets killed=1)
    local pid="$1" timeout="$2" deadline
    killed=0
    kill -TERM "$pid" 2>/dev/null || return 0
    deadline=$(( $(now_ms) + timeout * 1000 ))
    while kill -0 "$pid" 2>/dev/null; do
        if (( $(now_ms) > deadline )); then
            err "pid $pid still running ${timeout}s after SIGTERM; sending SIGKILL"
            killed=1
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
            break
        fi
        sleep 0.1
    done
}

stop_watchdog() {
    local wpid cmdline
    [[ -f "$WATCHDOG_PID_FILE" ]] || return 0
    wpid="$(cat "$WATCHDOG_PID_FILE" 2>/dev/null || true)"
    if [[ "$wpid" =~ ^[0-9]+$ ]]; then
        cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$wpid/cmdline" || true)"
        if [[ "$cmdline" == *kafka-watchdog* && "$cmdline" == *"$PID_FILE"* ]]; then
            kill -TERM "$wpid" 2>/dev/null || true
        fi
    fi
    rm -f "$WATCHDOG_PID_FILE"
}

# ----------------------------------------------------------------------------- config

write_server_properties() {
    local jaas_scram='org.apache.kafka.common.security.scram.ScramLoginModule required;'
    local jaas_plain="org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER=\"$KAFKA_SASL_PASSWORD\";"
    cat >"$PROPS" <<EOF
# Generated by deploy/local/kafka.sh for instance '$KAFKA_NAME' -- edits are lost on the next start.
# Single node, KRaft combined mode (broker + controller in one JVM).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
controller.listener.names=CONTROLLER

# Everything on loopback only.
# EXPIRED is a second SSL listener whose certificate expired long ago, for tests of TLS failures.
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT,EXPIRED://127.0.0.1:$KAFKA_SSL_EXPIRED_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT,EXPIRED://127.0.0.1:$KAFKA_SSL_EXPIRED_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,EXPIRED:SSL
inter.broker.listener.name=PLAINTEXT

# SASL on the SASL_PLAINTEXT listener. SCRAM users are written into the metadata log at
# format time (kafka-storage format --add-scram). Every enabled mechanism needs a JAAS entry,
# SCRAM too (an empty ScramLoginModule), otherwise the broker dies at startup with
# "Could not find a 'KafkaServer' or 'sasl_plaintext.KafkaServer' entry in the JAAS configuration".
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=$jaas_scram
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=$jaas_scram
listener.name.sasl_plaintext.plain.sasl.jaas.config=$jaas_plain
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$jaas_scram
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$jaas_scram
listener.name.sasl_ssl.plain.sasl.jaas.config=$jaas_plain

# TLS on SSL, SASL_SSL and EXPIRED: PEM files made at start by make_certs (no keytool, no JKS).
# A PEM keystore holds the unencrypted PKCS#8 key and the certificate chain. On SSL, client
# certificates are verified against the CA when a client offers one ("requested"), so
# --ssl-certfile can be tested (Kafka applies ssl.client.auth to SSL listeners only).
ssl.keystore.type=PEM
ssl.keystore.location=$TLS_DIR/broker.keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
listener.name.ssl.ssl.client.auth=requested
listener.name.expired.ssl.keystore.location=$TLS_DIR/expired.keystore.pem
# One network thread per TLS listener, not num.network.threads (3): every network thread builds
# its own SSL context at startup, the costly part of these listeners (benchmarks use PLAINTEXT).
listener.name.ssl.num.network.threads=1
listener.name.sasl_ssl.num.network.threads=1
listener.name.expired.num.network.threads=1

log.dirs=$DATA_DIR

# Single-node replication settings.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
default.replication.factor=1
min.insync.replicas=1
num.partitions=1
# Producers/consumers may create topics implicitly (with num.partitions=1). Tests should
# still create their topics explicitly with the partition count they need.
auto.create.topics.enable=true
delete.topic.enable=true

# Fast startup and fast first consumer group.
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=${KAFKA_OFFSETS_PARTITIONS:-1}
transaction.state.log.num.partitions=${KAFKA_OFFSETS_PARTITIONS:-1}
# Default 128 MiB: allocating it costs ~1 s at startup and a quarter of the heap.
log.cleaner.dedupe.buffer.size=16777216
EOF
}

# ----------------------------------------------------------------------------- TLS

# A fresh CA and broker certificate on every start (a few openssl calls, no JVM): EC P-256 keys,
# SAN IP:127.0.0.1 and DNS:localhost, so clients verify the host name too. In run/<name>/tls/:
#   ca.pem                  the CA to trust (clients: --ssl-cafile)
#   broker.keystore.pem     broker key + certificate (the SSL and SASL_SSL listeners)
#   expired.keystore.pem    broker key + a certificate valid 2020-01-01..2020-01-02 (EXPIRED)
#   client.pem, client.key  a client certificate from the same CA (--ssl-certfile / --ssl-keyfile)
# The expired certificate is signed with `openssl ca`: OpenSSL 3.0's `x509` and `req` cannot set a
# start date. After the CA, the three certificates are made in parallel. The whole costs about
# 0.5 s on the 2 shared cores at load 20 (openssl's own start-up, mostly), against 1.5-2.5 s that
# the broker spends building its first SSL context (see deploy/local/README.md).
make_certs() {
    need openssl "install it: apt-get install -y openssl"
    local d="$TLS_DIR" log="$RUN_DIR/openssl.log"
    [[ -n "$d" && "$d" == "$RUN_DIR/tls" ]] || die "internal: TLS_DIR is '$d'"
    rm -rf "$d"
    mkdir -p "$d/issued"
    chmod 700 "$d"
    : >"$d/index.txt"
    echo 01 >"$d/serial"
    cat >"$d/ca.cnf" <<EOF
[ca]
default_ca = local
[local]
database = $d/index.txt
new_certs_dir = $d/issued
serial = $d/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
EOF
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    local signed=(-CA "$d/ca.pem" -CAkey "$d/ca.key" -days 3650)
    local ok=1 job
    local -a jobs=()
    openssl req -x509 "${ec[@]}" -keyout "$d/ca.key" -out "$d/ca.pem" -days 3650 \
        -subj "/CN=streamdedup local CA $KAFKA_NAME $(date +%s)" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        >"$log" 2>&1 || ok=0
    if (( ok )); then
        {   # the broker's key and its two certificates, valid and expired
            openssl req -new "${ec[@]}" -keyout "$d/broker.key" -out "$d/broker.csr" -subj "/CN=127.0.0.1" &&
                { openssl x509 -req -in "$d/broker.csr" "${signed[@]}" -set_serial "0x$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" \
                    -extfile "$d/ca.cnf" -extensions server -out "$d/broker.pem" &
                    openssl ca -batch -notext -config "$d/ca.cnf" -cert "$d/ca.pem" -keyfile "$d/ca.key" \
                        -extensions server -startdate 20200101000000Z -enddate 20200102000000Z \
                        -in "$d/broker.csr" -out "$d/expired.pem" &&
                    wait $!; }
        } >"$log.broker" 2>&1 &
        jobs+=($!)
        openssl req -x509 "${ec[@]}" "${signed[@]}" -keyout "$d/client.key" -out "$d/client.pem" \
            -subj "/CN=$KAFKA_SASL_USER" -config "$d/ca.cnf" -extensions client >"$log.client" 2>&1 &
        jobs+=($!)
        for job in "${jobs[@]}"; do wait "$job" || ok=0; done
        cat "$log.broker" "$log.client" >>"$log"
    fi
    local f
    for f in ca.pem broker.pem expired.pem client.pem; do [[ -s "$d/$f" ]] || ok=0; done
    if (( ! ok )); then
        err "making the TLS certificates failed; $log says:"
        sed 's/^/    /' "$log" >&2
        exit 1
    fi
    # Without the CA: servers send their chain without the root, which the client must already trust.
    cat "$d/broker.key" "$d/broker.pem" >"$d/broker.keystore.pem"
    cat "$d/broker.key" "$d/expired.pem" >"$d/expired.keystore.pem"
    rm -rf "$d/issued" "$d/broker.csr" "$d"/index.txt* "$d"/serial* "$log" "$log.broker" "$log.client"
}

# ----------------------------------------------------------------------------- class-data sharing

# The JVM spends much of the broker's start loading and verifying Kafka's and Scala's classes.
# A dynamic CDS archive of them (JDK 13+) cuts that: the first broker of a jar set runs with
# -XX:ArchiveClassesAtExit and writes run/<name>/classes.jsa when it stops; a clean `stop` moves
# it to run/.cds/<key>.jsa, which later starts map (-XX:SharedArchiveFile). The key covers the
# jars, the java binary and the JVM options; a JVM that cannot use an archive ignores it
# (-Xshare:auto). KAFKA_CDS=0 turns this off.
cds_setup() {
    cds_flags=() cds_archive="" cds_recording=0
    [[ "${KAFKA_CDS:-1}" == 1 ]] || return 0
    local key
    key="$(printf '%s\n' "$(head -n 1 "$STAMP")" "$(readlink -f "$(command -v java)")" "$KAFKA_HEAP" \
        "$KAFKA_JVM_OPTS" "$KAFKA_OPTS" | sha256sum | cut -c1-16)"
    cds_archive="$CDS_DIR/$key.jsa"
    # The archive's own warnings (classes it cannot hold, e.g. reload4j's) are noise in kafka.log.
    cds_flags=(-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off)
    if [[ -s "$cds_archive" ]]; then
        cds_flags+=("-XX:SharedArchiveFile=$cds_archive")
    else
        rm -f "$CDS_RECORD"
        cds_flags+=("-XX:ArchiveClassesAtExit=$CDS_RECORD")
        cds_recording=1
    fi
}

cds_keep() {  # after a stop: keep the archive the JVM wrote, if it exited on its own
    if [[ "${killed:-0}" == 0 && -s "$CDS_RECORD" && -n "${KAFKA_CDS_ARCHIVE:-}" ]]; then
        mkdir -p "$CDS_DIR"
        # Older archives (other jar sets) are dropped: each is ~50 MB.
        find "$CDS_DIR" -maxdepth 1 -name '*.jsa' ! -name "$(basename "$KAFKA_CDS_ARCHIVE")" -delete 2>/dev/null || true
        mv -f "$CDS_RECORD" "$CDS_DIR/.tmp.$$.jsa" && mv -fT "$CDS_DIR/.tmp.$$.jsa" "$KAFKA_CDS_ARCHIVE"
        say "kept the class-data archive for later starts: $KAFKA_CDS_ARCHIVE"
    fi
    rm -f "$CDS_RECORD"
}

# ----------------------------------------------------------------------------- commands

write_instance_env() {
    cat >"$INSTANCE_ENV" <<EOF
KAFKA_NAME=$KAFKA_NAME
KAFKA_PORT=$KAFKA_PORT
KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT
KAFKA_SASL_PORT=$KAFKA_SASL_PORT
KAFKA_SSL_PORT=$KAFKA_SSL_PORT
KAFKA_SASL_SSL_PORT=$KAFKA_SASL_SSL_PORT
KAFKA_SSL_EXPIRED_PORT=$KAFKA_SSL_EXPIRED_PORT
KAFKA_SSL_CAFILE=$TLS_DIR/ca.pem
KAFKA_SASL_USER=$KAFKA_SASL_USER
KAFKA_CDS_ARCHIVE=$cds_archive
KAFKA_CDS_RECORDING=$cds_recording
KAFKA_VERSION_RUNNING=$(installed_version)
KAFKA_STARTED_AT=$(date -Is)
EOF
}

load_instance_env() {  # ports of a started instance win over the environment defaults
    [[ -f "$INSTANCE_ENV" ]] || return 0
    local k v
    while IFS='=' read -r k v; do
        case "$k" in
            KAFKA_PORT|KAFKA_CONTROLLER_PORT|KAFKA_SASL_PORT|KAFKA_SSL_PORT|KAFKA_SASL_SSL_PORT|KAFKA_SSL_EXPIRED_PORT|KAFKA_SASL_USER|KAFKA_VERSION_RUNNING|KAFKA_STARTED_AT|KAFKA_CDS_ARCHIVE|KAFKA_CDS_RECORDING)
                printf -v "$k" '%s' "$v" ;;
        esac
    done <"$INSTANCE_ENV"
}

# kafka-storage format costs a JVM start (~1.5 s on 2 busy cores). The formatted directory
# only depends on the Kafka jars, node.id and the SCRAM user, so it is formatted once into
# run/.format-cache/<key>/ and copied for every fresh start (KAFKA_FORMAT_CACHE=0 disables).
# All instances made from one template share its cluster id, which is harmless here.
# A Kafka Uuid: 16 random bytes, URL-safe base64 without padding (what `kafka-storage random-uuid`
# prints), and, as Kafka's Uuid.randomUuid, never one starting with "-": the tool's argument parser
# takes that for an option ("--cluster-id: expected one argument"; 1 start in 64 failed so).
new_cluster_id() {
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
        [[ "$id" == -* ]] || break
    done
    printf '%s\n' "$id"
}

format_data_dir() {
    local key cache tmp cluster_id
    key="$(printf '%s\n' "$(head -n 1 "$STAMP")" "$KAFKA_SASL_USER" "$KAFKA_SASL_PASSWORD" "node.id=1" \
        | sha256sum | cut -c1-16)"
    cache="$RUN_ROOT/.format-cache/$key"
    if [[ "${KAFKA_FORMAT_CACHE:-1}" == 1 && -f "$cache/meta.properties" ]]; then
        cp -a "$cache" "$DATA_DIR"
        return 0
    fi
    tmp="$RUN_DIR/.format.$$"
    rm -rf "$tmp"
    cluster_id="$(new_cluster_id)"
    sed "s|^log.dirs=.*|log.dirs=$tmp|" "$PROPS" >"$RUN_DIR/format.properties"
    # A short-lived tool: C1 only and a small heap start fastest.
    if ! java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            "-Dlog4j.configuration=file:$HERE/log4j.properties" \
            -cp "$LIB/*" kafka.tools.StorageTool format \
            --config "$RUN_DIR/format.properties" --cluster-id "$cluster_id" \
            --add-scram "SCRAM-SHA-256=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]" \
            --add-scram "SCRAM-SHA-512=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]" \
            >"$RUN_DIR/format.log" 2>&1; then
        rm -rf "$tmp"
        err "kafka-storage format failed; last lines of $RUN_DIR/format.log:"
        tail -n 30 "$RUN_DIR/format.log" >&2
        exit 1
    fi
    rm -f "$RUN_DIR/format.properties"
    if [[ "${KAFKA_FORMAT_CACHE:-1}" == 1 ]]; then
        mkdir -p "$RUN_ROOT/.format-cache"
        cp -a "$tmp" "$RUN_DIR/.format-tpl.$$"
        mv -T "$RUN_DIR/.format-tpl.$$" "$cache" 2>/dev/null || rm -rf "$RUN_DIR/.format-tpl.$$"
    fi
    mv -T "$tmp" "$DATA_DIR"
}

cmd_start() {
    local arg
    for arg in "$@"; do
        case "$arg" in
            --keep) KAFKA_KEEP_DATA=1 ;;
            --fresh) KAFKA_KEEP_DATA=0 ;;
            *) die "start: unknown option '$arg' (use --keep or --fresh)" ;;
        esac
    done
    check_name
    check_ports
    check_sasl
    [[ "$KAFKA_START_TIMEOUT" =~ ^[0-9]+$ ]] || die "KAFKA_START_TIMEOUT must be whole seconds"

    local pid
    if pid="$(running_pid)"; then
        local want
        want="$(ports_string)"
        load_instance_env
        if [[ "$want" == "$(ports_string)" ]]; then
            say "already running (pid $pid) on 127.0.0.1:$KAFKA_PORT"
            return 0
        fi
        die "already running (pid $pid) with ports $(ports_string), not $want; stop it first or use another KAFKA_NAME"
    fi
    rm -f "$PID_FILE"
    stop_watchdog

    ensure_installed

    local v p
    for v in "${PORT_VARS[@]}"; do
        p="${!v}"
        if port_in_use "$p"; then
            err "port $p ($v) on 127.0.0.1 is already in use:"
            port_listener "$p" | sed 's/^/    /' >&2
            err "stop that process, or pick other ports, e.g.: KAFKA_NAME=mine KAFKA_PORT=19092 KAFKA_CONTROLLER_PORT=19093 KAFKA_SASL_PORT=19094 KAFKA_SSL_PORT=19095 KAFKA_SASL_SSL_PORT=19096 KAFKA_SSL_EXPIRED_PORT=19097 $0 start"
            exit 1
        fi
    done

    local t0 java_heap
    t0=$(now_ms)
    mkdir -p "$RUN_DIR"
    [[ -f "$LOG_FILE" ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"
    make_certs
    write_server_properties

    if [[ "$KAFKA_HEAP" == -* ]]; then java_heap="$KAFKA_HEAP"; else java_heap="-Xmx$KAFKA_HEAP"; fi
    # Word splitting of the option strings is intended.
    # shellcheck disable=SC2206
    local jvm=($java_heap $KAFKA_JVM_OPTS "-Dlog4j.configuration=file:$HERE/log4j.properties" $KAFKA_OPTS)
    cds_setup
    jvm+=("${cds_flags[@]}")

    if [[ "$KAFKA_KEEP_DATA" == 1 && -f "$DATA_DIR/meta.properties" ]]; then
        say "keeping existing data in $DATA_DIR"
    else
        rm -rf "$DATA_DIR"
        format_data_dir
    fi

    say "starting Kafka $(installed_version) (KRaft broker+controller) on 127.0.0.1:$KAFKA_PORT ..."
    rm -f "$PID_FILE"
    # setsid: own session, so a Ctrl-C meant for the caller (e.g. pytest) does not hit the broker;
    # the inner bash writes its own pid and execs java, so the pid file holds the JVM's pid.
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-launcher "$PID_FILE" \
        java "${jvm[@]}" -cp "$LIB/*" kafka.Kafka "$PROPS" \
        >>"$LOG_FILE" 2>&1 </dev/null &
    local launcher=$!
    local deadline=$(( t0 + KAFKA_START_TIMEOUT * 1000 ))
    while [[ ! -s "$PID_FILE" ]] && kill -0 "$launcher" 2>/dev/null && (( $(now_ms) < deadline )); do
        sleep 0.05
    done
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ -n "$pid" ]] || pid=$launcher
    write_instance_env

    local failure=""
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            failure="the broker exited during startup"
            break
        fi
        if grep -q "$STARTED_PATTERN" "$LOG_FILE" 2>/dev/null \
                && port_accepts "$KAFKA_PORT" && port_accepts "$KAFKA_SASL_PORT" \
                && port_accepts "$KAFKA_SSL_PORT" && port_accepts "$KAFKA_SASL_SSL_PORT" \
                && port_accepts "$KAFKA_SSL_EXPIRED_PORT"; then
            break
        fi
        if (( $(now_ms) > deadline )); then
            failure="no '$STARTED_PATTERN' within ${KAFKA_START_TIMEOUT}s (KAFKA_START_TIMEOUT)"
            break
        fi
        sleep 0.1
    done
    if [[ -n "$failure" ]]; then
        err "$failure; last lines of $LOG_FILE:"
        tail -n 40 "$LOG_FILE" | sed 's/^/    /' >&2
        if is_our_broker "$pid"; then terminate "$pid" 10; fi
        rm -f "$PID_FILE"
        exit 1
    fi

    if [[ -n "${KAFKA_WATCH_PID:-}" ]]; then
        [[ "$KAFKA_WATCH_PID" =~ ^[0-9]+$ ]] || die "KAFKA_WATCH_PID must be a pid"
        # Stops the broker when the watched process (a test run) goes away without calling stop.
        # shellcheck disable=SC2016  # expanded by the inner bash
        setsid bash -c '
            watched=$1 pid=$2 pidfile=$3 props=$4
            while kill -0 "$watched" 2>/dev/null; do
                [[ "$(cat "$pidfile" 2>/dev/null)" == "$pid" ]] || exit 0
                sleep 1
            done
            cmd="$(tr "\0" " " 2>/dev/null <"/proc/$pid/cmdline")" || exit 0
            [[ "$cmd" == *kafka.Kafka* && "$cmd" == *"$props"* ]] || exit 0
            kill -TERM "$pid"
            for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null
            rm -f "$pidfile"
        ' kafka-watchdog "$KAFKA_WATCH_PID" "$pid" "$PID_FILE" "$PROPS" >/dev/null 2>&1 </dev/null &
        echo $! >"$WATCHDOG_PID_FILE"
    fi

    say "started in $(elapsed "$t0") s (pid $pid)"
    say "  bootstrap  PLAINTEXT      127.0.0.1:$KAFKA_PORT"
    say "             SASL_PLAINTEXT 127.0.0.1:$KAFKA_SASL_PORT  (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN; user '$KAFKA_SASL_USER')"
    say "             SSL            127.0.0.1:$KAFKA_SSL_PORT  (CA: $TLS_DIR/ca.pem)"
    say "             SASL_SSL       127.0.0.1:$KAFKA_SASL_SSL_PORT  (TLS + the SASL mechanisms above)"
    say "             SSL, expired   127.0.0.1:$KAFKA_SSL_EXPIRED_PORT  (its certificate expired in 2020; for tests)"
    say "  log: $LOG_FILE"
}

cmd_stop() {
    check_name
    local pid
    stop_watchdog
    if ! pid="$(running_pid)"; then
        if [[ -f "$PID_FILE" ]]; then
            say "not running (removing stale pid file)"
            rm -f "$PID_FILE"
        else
            say "not running"
        fi
        return 0
    fi
    local t0 timeout="$KAFKA_STOP_TIMEOUT"
    t0=$(now_ms)
    load_instance_env
    # A JVM that records the class archive writes it on exit (~50 MB, several seconds): give it time.
    [[ "${KAFKA_CDS_RECORDING:-0}" == 1 ]] && (( timeout < 120 )) && timeout=120
    terminate "$pid" "$timeout"
    rm -f "$PID_FILE"
    say "stopped pid $pid in $(elapsed "$t0") s"
    if [[ "${KAFKA_CDS_RECORDING:-0}" == 1 ]]; then
        cds_keep
    fi
}

status_one() {
    local pid
    load_instance_env
    if pid="$(running_pid)"; then
        say "running (pid $pid, Kafka ${KAFKA_VERSION_RUNNING:-?}, since ${KAFKA_STARTED_AT:-?})"
        say "  PLAINTEXT       127.0.0.1:$KAFKA_PORT   (bootstrap)"
        say "  SASL_PLAINTEXT  127.0.0.1:$KAFKA_SASL_PORT   SCRAM-SHA-256, SCRAM-SHA-512, PLAIN; user '$KAFKA_SASL_USER'"
        say "  SSL             127.0.0.1:$KAFKA_SSL_PORT   CA $TLS_DIR/ca.pem"
        say "  SASL_SSL        127.0.0.1:$KAFKA_SASL_SSL_PORT   TLS + SASL as above"
        say "  SSL (expired)   127.0.0.1:$KAFKA_SSL_EXPIRED_PORT   its certificate expired in 2020"
        say "  CONTROLLER      127.0.0.1:$KAFKA_CONTROLLER_PORT"
        say "  data: $DATA_DIR"
        say "  log:  $LOG_FILE"
        return 0
    fi
    say "not running"
    return 3
}

cmd_status() {
    if [[ "${1:-}" == "--all" ]]; then
        local d any=0
        for d in "$RUN_ROOT"/*/; do
            [[ -d "$d" ]] || continue
            any=1
            (KAFKA_NAME="$(basename "$d")" "$0" status) || true
        done
        (( any )) || echo "kafka.sh: no instances under $RUN_ROOT"
        return 0
    fi
    check_name
    status_one
}

cmd_logs() {
    check_name
    local follow=() n=200 arg
    for arg in "$@"; do
        case "$arg" in
            -f|--follow) follow=(-F) ;;
            [0-9]*) n="$arg" ;;
            *) die "logs: unknown option '$arg'" ;;
        esac
    done
    [[ -f "$LOG_FILE" ]] || die "no log yet ($LOG_FILE)"
    exec tail -n "$n" "${follow[@]}" "$LOG_FILE"
}

cmd_clean() {
    check_name
    if running_pid >/dev/null; then die "still running; stop it first"; fi
    stop_watchdog
    rm -rf "$RUN_DIR"
    say "removed $RUN_DIR"
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        install) cmd_install "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        logs) cmd_logs "$@" ;;
        clean) cmd_clean "$@" ;;
        -h|--help|help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

# (sourced, as by tests/test_kafka_sh.py: the functions only)
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
