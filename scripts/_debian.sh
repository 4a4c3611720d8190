# Sourced by the install scripts: the one way they get a system package. The caller
# defines `have` (true once the binaries are found) and may define `before_install`.
# debian_package SCRIPT PACKAGE WHAT [apt-get install options...]: nothing when `have`
# finds it already; otherwise, as root only, apt-get installs PACKAGE, then `have` again.
debian_package() {
    local script=$1 package=$2 what=$3
    shift 3
    if have; then
        return 0
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "$script: $what not found; run as root (or install the Debian package $package)" >&2
        exit 1
    fi
    echo "$script: installing the Debian package $package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    if declare -F before_install >/dev/null; then
        before_install
    fi
    apt-get install -y "$@" "$package"
    have || { echo "$script: $what still not found after install" >&2; exit 1; }
}
