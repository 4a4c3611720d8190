#!/usr/bin/env bash
# Install the pinned restate-server and the restate CLI of the same version (npm packages
# @restatedev/restate-server and @restatedev/restate) into .engines/restate inside the
# repository (git-ignored) and print the path of the real server binary; the CLI lands
# beside it in node_modules/@restatedev/restate-linux-x64/bin/restate.
# Idempotent: does nothing but print the path when the pinned version is present.
set -euo pipefail

VERSION="${RESTATE_SERVER_VERSION:-1.7.12}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.engines/restate"
BIN="$PREFIX/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
CLI="$PREFIX/node_modules/@restatedev/restate-linux-x64/bin/restate"
STAMP="$PREFIX/.version"

if [[ -x "$BIN" && -x "$CLI" && -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION" ]]; then
    echo "$BIN"
    exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "install-restate: npm is required" >&2; exit 1; }
case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) echo "install-restate: only linux-x64 is supported by this script" >&2; exit 1 ;;
esac

mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --prefix "$PREFIX" \
    "@restatedev/restate-server@$VERSION" "@restatedev/restate@$VERSION" >&2
for wanted in "$BIN" "$CLI"; do
    [[ -x "$wanted" ]] || { echo "install-restate: binary missing after install: $wanted" >&2; exit 1; }
done
echo "$VERSION" > "$STAMP"
echo "$BIN"
