#!/usr/bin/env bash
# Start time of the local broker: this checkout's deploy/local/kafka.sh against the one of a git
# revision, started alternately (A, B, A, B, ...) so that both see the same machine load.
#
#   deploy/local/start-bench.sh [REV] [PAIRS]     REV defaults to HEAD~1, PAIRS to 6
#
# Prints one line per start ("base|this seconds load=...") and the medians. Each side runs from a
# copy of deploy/local in a temporary directory (sharing lib/), so nothing here is touched; the
# first start of each side also formats its template (run/.format-cache), so its pair is dropped.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REV="${1:-HEAD~1}"
PAIRS="${2:-6}"
TMP="$(mktemp -d)"
trap 'for s in base this; do KAFKA_NAME=bench "$TMP/$s/kafka.sh" stop >/dev/null 2>&1 || true; done; rm -rf "$TMP"' EXIT
for side in base this; do
    mkdir -p "$TMP/$side"
    ln -s "$HERE/lib" "$TMP/$side/lib"
    for f in kafka.sh log4j.properties pom.xml; do
        if [[ $side == base ]]; then
            git -C "$HERE" show "$REV:deploy/local/$f" >"$TMP/$side/$f"
        else
            cp "$HERE/$f" "$TMP/$side/$f"
        fi
    done
    chmod +x "$TMP/$side/kafka.sh"
done
ports() {
    python3 -c 'import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])'
}
declare -A times=([base]="" [this]="")
for i in $(seq 0 "$PAIRS"); do
    for side in base this; do
        read -r a b c d e f <<<"$(ports)"
        export KAFKA_NAME=bench KAFKA_PORT=$a KAFKA_CONTROLLER_PORT=$b KAFKA_SASL_PORT=$c \
            KAFKA_SSL_PORT=$d KAFKA_SASL_SSL_PORT=$e KAFKA_SSL_EXPIRED_PORT=$f
        t="$("$TMP/$side/kafka.sh" start | sed -n 's/.*started in \([0-9.]*\) s.*/\1/p')"
        "$TMP/$side/kafka.sh" stop >/dev/null
        "$TMP/$side/kafka.sh" clean >/dev/null
        if ((i == 0)); then
            echo "$side $t (first start, formats: dropped)"
        else
            echo "$side $t load=$(cut -d' ' -f1 /proc/loadavg)"
            times[$side]+="$t "
        fi
    done
done
for side in base this; do
    # shellcheck disable=SC2086
    printf '%s median %s s over %d starts\n' "$side" \
        "$(printf '%s\n' ${times[$side]} | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')" "$PAIRS"
done
