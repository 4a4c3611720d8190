#!/usr/bin/env bash
# System package of the Redis example host (examples/redis_host): the redis-server binary
# that its test fixture starts on a free loopback port in a temp dir. Idempotent and quick
# when already present: installs the Debian package redis-server only when redis-server is
# not on PATH. The Python client (redis) comes with the dev extra.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
    echo "install-redis: redis-server not found; run as root (or install the Debian package redis-server)" >&2
    exit 1
fi

echo "install-redis: installing the Debian package redis-server" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
# The tests start their own servers: keep the package from starting a system-wide one.
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt-get install -y --no-install-recommends redis-server
command -v redis-server >/dev/null 2>&1 || { echo "install-redis: redis-server still not found after install" >&2; exit 1; }
