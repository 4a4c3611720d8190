#!/usr/bin/env bash
# The browser the timeline page tests drive (through the playwright package, never a
# browser build of its own): Debian's chromium. Idempotent and quick when present.
set -euo pipefail

have_chromium() {
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

if have_chromium; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-chromium: chromium not found and not root: the timeline page tests will" \
        "skip (install the Debian package chromium to run them)" >&2
    exit 0
fi

echo "install-chromium: installing the Debian package chromium" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
have_chromium || { echo "install-chromium: chromium still not found after install" >&2; exit 1; }
