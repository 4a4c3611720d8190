#!/usr/bin/env bash
# Install the pinned restate-server (npm package) into .engines/restate inside the
# repository (git-ignored) and print the path of the real server binary.
# Idempotent: does nothing but print the path when the pinned version is present.
set -euo pipefail

VERSION="${RESTATE_SERVER_VERSION:-1.7.12}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.engines/restate"
BIN="$PREFIX/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
STAMP="$PREFIX/.version"

if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION" ]]; then
    echo "$BIN"
    exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "install-restate: npm is required" >&2; exit 1; }
case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) echo "install-restate: only linux-x64 is supported by this script" >&2; exit 1 ;;
esac

mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --prefix "$PREFIX" "@restatedev/restate-server@$VERSION" >&2
[[ -x "$BIN" ]] || { echo "install-restate: binary missing after install: $BIN" >&2; exit 1; }
echo "$VERSION" > "$STAMP"
echo "$BIN"
