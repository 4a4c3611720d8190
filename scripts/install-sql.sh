#!/usr/bin/env bash
# System packages of the SQL tier: the PostgreSQL server binaries (initdb, pg_ctl, postgres)
# that the test fixtures start in a temp dir. Idempotent and quick when already present:
# installs the Debian package postgresql only when initdb is found neither on PATH nor
# under /usr/lib/postgresql/*/bin. SQLite needs nothing (Python's standard library).
set -euo pipefail

have_initdb() {
    command -v initdb >/dev/null 2>&1 && return 0
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null 2>&1
}

if have_initdb; then
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
    echo "install-sql: initdb not found; run as root (or install the Debian package postgresql)" >&2
    exit 1
fi

echo "install-sql: installing the Debian package postgresql" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y postgresql
have_initdb || { echo "install-sql: initdb still not found after install" >&2; exit 1; }
