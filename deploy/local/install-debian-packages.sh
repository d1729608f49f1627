#!/usr/bin/env bash
# Debian/Ubuntu packages used by the local tooling: kcat (Kafka CLI client, used by
# tests/integration/test_broker.py), prometheus (scrapes streamdedup's metrics) and gcc (builds
# the HTML text walk and the word hashes in C, streamdedup/fingerprinting/*.c, at `pip install`).
# Idempotent and non-interactive: installs only what is missing; runs apt-get update only then.
set -euo pipefail

want=(kcat prometheus gcc)
missing=()
for pkg in "${want[@]}"; do
    if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        echo "install-debian-packages: $pkg already installed ($(dpkg-query -W -f='${Version}' "$pkg"))"
    else
        missing+=("$pkg")
    fi
done
(( ${#missing[@]} == 0 )) && exit 0

sudo=()
if (( EUID != 0 )); then
    command -v sudo >/dev/null 2>&1 || { echo "install-debian-packages: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo env DEBIAN_FRONTEND=noninteractive)
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-debian-packages: installing ${missing[*]} ..."
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian prometheus package enables and starts a system service listening on *:9090;
# we only want the binary. Stop/disable it where systemd runs (not in containers).
if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1 \
        && [[ -d /run/systemd/system ]]; then
    "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
for pkg in "${missing[@]}"; do
    echo "install-debian-packages: installed $pkg $(dpkg-query -W -f='${Version}' "$pkg")"
done
