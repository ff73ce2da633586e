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
