#!/usr/bin/env bash
# The README's test command: installs what the test suite needs when it is missing (Debian or
# Ubuntu packages, as root; otherwise it says what to install), then runs `cargo test --locked`
# and prints one total over every test binary as the last line. Safe to run again on a machine
# that has it all: then it installs nothing. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: $*; install them (sudo apt-get install $*) and rerun" >&2
    exit 1
  fi
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL server binaries: the tests start a throwaway cluster with initdb/pg_ctl unless
# DATABASE_URL points at a server.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  log "installing PostgreSQL server binaries"
  apt_install postgresql
fi

# Lock services and tools for the bring-your-own-lock examples (examples/*.sh) and their tests
# (tests/api/byol.rs, which start throwaway redis-server and etcd servers themselves).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v jq >/dev/null 2>&1 || missing+=(jq)
# tests/api/pooler.rs: fencegate behind PgBouncer (Debian's, at /usr/sbin/pgbouncer).
[ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# The Patroni fault run (tests/fault/patroni.rs): Patroni 3 (with patronictl) over etcd
# (etcd-server, above), behind HAProxy.
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
# The partition test (tests/api/partition.rs) drops a throwaway cluster's packets with iptables.
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
# The console's browser tests (tests/browser): a headless chromium driven through chromedriver.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# The client libraries' own test runners (tests/clients): Node.js 20.3+ with npm, Python 3
# with venv (each library's test.sh installs its packages from npm and PyPI), Go (the Go client
# builds offline, standard library only), a JDK with javac and JUnit 5's console launcher (the
# Java client has no dependencies), and openssl (the Java client's TLS test makes a CA with it).
missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
[ -f /usr/share/java/junit-platform-console-standalone.jar ] || missing+=(junit5)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The deployment files (tests/deploy): promtool checks the alert rules, systemd-analyze the unit.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# The OpenAPI document is checked by a real validator (tests/api/openapi.rs).
if ! python3 -c 'import openapi_spec_validator' >/dev/null 2>&1; then
  command -v python3 >/dev/null 2>&1 || apt_install python3
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  log "installing openapi-spec-validator"
  python3 -m pip install --quiet openapi-spec-validator \
    || python3 -m pip install --quiet --break-system-packages openapi-spec-validator
fi

# The document is held to the server by schemathesis (tests/api/schemathesis.rs): from PyPI,
# into a venv under target/ when pip refuses to install into the system's Python.
if ! command -v st >/dev/null 2>&1 && [ ! -x target/schemathesis-venv/bin/st ]; then
  log "installing schemathesis"
  python3 -m pip install --quiet schemathesis \
    || { python3 -m venv target/schemathesis-venv && target/schemathesis-venv/bin/pip install --quiet schemathesis; }
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) and rerun" >&2
  exit 1
fi

log "toolchain: $(cargo --version)"
mkdir -p target
# The house rules (DESIGN.md, *Shape of the code*): formatted, and clippy-clean with warnings as
# errors. Each counts as one check in the total; a failure fails the run after the tests ran.
house_passed=0
house_failed=0
for tool in rustfmt clippy-driver; do
  command -v "$tool" >/dev/null 2>&1 || command -v "cargo-${tool%-driver}" >/dev/null 2>&1 ||
    { echo "$tool not found: install it with the Rust toolchain (rustup component add rustfmt clippy)" >&2; exit 1; }
done
log "house rules: cargo fmt --check"
if cargo fmt --check; then house_passed=$((house_passed + 1)); else house_failed=$((house_failed + 1)); echo "cargo fmt --check: run cargo fmt" >&2; fi
log "house rules: cargo clippy --all-targets --locked -- -D warnings"
if cargo clippy --all-targets --locked -- -D warnings; then house_passed=$((house_passed + 1)); else house_failed=$((house_failed + 1)); fi

log "running the test suite: cargo test --locked --no-fail-fast $*"
set -o pipefail
status=0
cargo test --locked --no-fail-fast "$@" 2>&1 | tee target/test.log || status=$?
# One plain total over every test binary, as the last line (also when a test failed).
awk -v hp="$house_passed" -v hf="$house_failed" \
  '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
   END { printf "%d passed, %d failed\n", p + hp, f + hf }' target/test.log
[ "$house_failed" -eq 0 ] || status=1
exit "$status"
