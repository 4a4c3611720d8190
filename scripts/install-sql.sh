#!/usr/bin/env bash
# System packages of the SQL tier: the PostgreSQL server binaries (initdb, pg_ctl, postgres)
# that the test fixtures start in a temp dir. Idempotent and quick when already present:
# installs the Debian package postgresql only when initdb is found neither on PATH nor
# under /usr/lib/postgresql/*/bin. SQLite needs nothing (Python's standard library).
set -euo pipefail
source "$(dirname "$0")/_debian.sh"

have() {
    command -v initdb >/dev/null 2>&1 && return 0
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null 2>&1
}

debian_package install-sql postgresql initdb
