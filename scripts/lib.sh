# Shared helpers for scripts/*: find Python, build the venv, start PostgreSQL.
# Sourced, not executed.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"

# pyenv's interpreters are not always on PATH (CI's environment is trimmed);
# putting them there also lets tox find python3.12 and python3.13.
for dir in "$HOME"/.pyenv/versions/3.1[0-9]*/bin; do
    [ -d "$dir" ] && PATH="$PATH:$dir"
done
export PATH

log() { printf '==> %s\n' "$*" >&2; }

# Print the path of a Python 3.11 interpreter, or fail.
find_python311() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 "$HOME"/.pyenv/versions/3.11*/bin/python3.11 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "No Python 3.11 found; set PYTHON=/path/to/python3.11." >&2
    return 1
}

# Create the venv if it is missing or broken, then install the project into it.
ensure_venv() {
    local extras="$1"
    if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        local python
        python="$(find_python311)"
        log "Creating $VENV with $python"
        rm -rf "$VENV"
        "$python" -m venv "$VENV"
    fi
    log "Installing cairnq-django[$extras] into $VENV"
    # This machine's pip config lists local indexes that may be absent; drop that noise.
    local output status=0
    output="$(mktemp)"
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$extras]" >"$output" 2>&1 || status=$?
    grep -v -e "^WARNING: Location 'file:" "$output" >&2 || true
    rm -f "$output"
    if [ "$status" != 0 ]; then
        echo "Installing the project into $VENV failed (pip exit $status)." >&2
        return 1
    fi
}

# Install tox into the venv (for tox.ini's Django x Python matrix) if missing.
ensure_tox() {
    if ! "$VENV/bin/python" -m tox --version >/dev/null 2>&1; then
        log "Installing tox into $VENV"
        "$VENV/bin/python" -m pip install --quiet "tox>=4.11" 2>&1 |
            grep -v "^WARNING: Location 'file:" >&2 || true
        "$VENV/bin/python" -m tox --version >/dev/null
    fi
}

# Start the local PostgreSQL cluster when nothing answers on 127.0.0.1:5432.
ensure_postgres() {
    if pg_isready -q -h "${PGHOST:-127.0.0.1}" -p "${PGPORT:-5432}" 2>/dev/null; then
        return 0
    fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        echo "PostgreSQL is not running and pg_ctlcluster is not installed." >&2
        return 1
    fi
    local version
    version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    log "Starting PostgreSQL $version"
    # "Already running" (a cluster still starting up) is fine: readiness decides.
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    local i
    for i in $(seq 1 30); do
        pg_isready -q -h "${PGHOST:-127.0.0.1}" -p "${PGPORT:-5432}" && return 0
        sleep 1
    done
    echo "PostgreSQL did not become ready within 30 s." >&2
    return 1
}

# Install Debian's chromium for the admin's browser test when it is missing.
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1; then
        # The browser test skips without a browser; here there is one, so a
        # skip would hide a broken setup.
        export CAIRNQ_REQUIRE_BROWSER="${CAIRNQ_REQUIRE_BROWSER:-1}"
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "chromium is missing and cannot be installed here; browser tests will skip"
        return 0
    fi
    log "Installing chromium with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # Wait for another apt run instead of failing on its lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >/dev/null
    export CAIRNQ_REQUIRE_BROWSER="${CAIRNQ_REQUIRE_BROWSER:-1}"
}

# For tests/reliability/test_network_faults.py (root only): iptables for the
# faults, and netfilterqueue in the venv for its 200 ms latency phase (the
# kernel has no sch_netem; libnetfilter-queue-dev is what it builds against).
# Without root or apt-get the test skips, saying why.
ensure_netfaults() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! command -v iptables >/dev/null 2>&1 || [ ! -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ]; then
        log "Installing iptables and libnetfilter-queue-dev with apt-get"
        apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq iptables libnetfilter-queue-dev >/dev/null
    fi
    if ! "$VENV/bin/python" -c "import netfilterqueue" 2>/dev/null; then
        "$VENV/bin/python" -m pip install --quiet "netfilterqueue==1.1.0" ||
            log "netfilterqueue did not install; the network test skips its latency phase"
    fi
}

# Start a PgBouncer in transaction pooling mode in front of 127.0.0.1:5432, for
# tests/test_pgbouncer.py, installing Debian's pgbouncer when missing. Exports
# CAIRNQ_PGBOUNCER_PORT (and CAIRNQ_REQUIRE_PGBOUNCER=1, so those tests fail
# rather than skip); stop_pgbouncer ends it. Every database name is passed
# through (`* =`), so pytest-django's test database is reachable by its name.
ensure_pgbouncer() {
    if [ -n "${CAIRNQ_PGBOUNCER_PORT:-}" ]; then
        return 0  # the caller runs one already
    fi
    if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
        if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
            log "pgbouncer is missing and cannot be installed here; PgBouncer tests will skip"
            return 0
        fi
        log "Installing pgbouncer with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq pgbouncer >/dev/null 2>&1 || {
            apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
            apt-get -o DPkg::Lock::Timeout=600 install -y -qq pgbouncer >/dev/null
        }
    fi
    local binary port dir user
    binary="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
    # It refuses to run as root; Debian's postgresql package provides this user.
    user="$(id -un)"
    [ "$user" = root ] && user=postgres
    port="$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/cairnq-pgbouncer.XXXXXX")"
    # auth_type=trust still looks the user up in auth_file.
    printf '"%s" ""\n' "${PGUSER:-root}" postgres >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=${PGHOST:-127.0.0.1} port=${PGPORT:-5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = ${PGUSER:-root}
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
pidfile = $dir/pgbouncer.pid
logfile = $dir/pgbouncer.log
INI
    [ "$(id -u)" = 0 ] && chown -R "$user" "$dir"
    log "Starting PgBouncer (transaction pooling) on 127.0.0.1:$port"
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$user" -- "$binary" -d -q "$dir/pgbouncer.ini"
    else
        "$binary" -d -q "$dir/pgbouncer.ini"
    fi
    local i
    for i in $(seq 1 50); do
        pg_isready -q -h 127.0.0.1 -p "$port" 2>/dev/null && break
        sleep 0.1
    done
    export CAIRNQ_PGBOUNCER_PORT="$port" CAIRNQ_REQUIRE_PGBOUNCER=1
    CAIRNQ_PGBOUNCER_DIR="$dir"
}

# Stop the PgBouncer ensure_pgbouncer started (if it did).
stop_pgbouncer() {
    local dir="${CAIRNQ_PGBOUNCER_DIR:-}"
    [ -n "$dir" ] || return 0
    if [ -f "$dir/pgbouncer.pid" ]; then
        kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    fi
    rm -rf "$dir"
    CAIRNQ_PGBOUNCER_DIR=""
}
