#!/usr/bin/env bash
# System package of the Redis example host (examples/redis_host): the redis-server binary
# that its test fixture starts on a free loopback port in a temp dir. Idempotent and quick
# when already present: installs the Debian package redis-server only when redis-server is
# not on PATH. The Python client (redis) comes with the dev extra.
set -euo pipefail
source "$(dirname "$0")/_debian.sh"

have() {
    command -v redis-server >/dev/null 2>&1
}

# The tests start their own servers: keep the package from starting a system-wide one.
before_install() {
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
}

debian_package install-redis redis-server redis-server --no-install-recommends
