# Sourced by .ci/run (set -euo pipefail is active): install NVIDIA Dynamo's
# runtime (the PyPI wheel ai-dynamo-runtime) for the live tests of
# kvevents/dynamo, which run Dynamo's own KV event publisher and metrics
# publisher (kvevents/dynamo/testdata/relay.py) against kvroute's
# subscriber.
#
# Only the wheel is installed, --no-deps: the relay imports dynamo._core
# alone, a self-contained Rust extension (no Python dependency is imported
# by it). The full ai-dynamo package, its frontend and its engines are not
# needed.
#
# Exports KVROUTE_DYNAMO_PYTHONPATH (the install directory, for the
# tests' PYTHONPATH). With CI != true this only exports it when a previous
# run installed the wheel, and changes nothing.

KVROUTE_DYNAMO_VERSION="1.6.1"
KVROUTE_DYNAMO_HOME="${KVROUTE_DYNAMO_HOME:-/opt/kvroute/ai-dynamo-runtime-${KVROUTE_DYNAMO_VERSION}}"

if [ "${CI:-}" = "true" ] && [ ! -e "${KVROUTE_DYNAMO_HOME}/dynamo/_core.abi3.so" ]; then
  echo "installing ai-dynamo-runtime==${KVROUTE_DYNAMO_VERSION} into ${KVROUTE_DYNAMO_HOME}"
  mkdir -p "${KVROUTE_DYNAMO_HOME}"
  kvroute_pip=(python3 -m pip install --quiet --disable-pip-version-check --no-deps
    --only-binary=:all: --target "${KVROUTE_DYNAMO_HOME}" "ai-dynamo-runtime==${KVROUTE_DYNAMO_VERSION}")
  # Debian's system Python refuses installs without --break-system-packages
  # (PEP 668); --target never touches the system site-packages.
  if ! "${kvroute_pip[@]}" 2>/dev/null; then
    "${kvroute_pip[@]}" --break-system-packages
  fi
  unset kvroute_pip
fi

if [ -e "${KVROUTE_DYNAMO_HOME}/dynamo/_core.abi3.so" ]; then
  export KVROUTE_DYNAMO_PYTHONPATH="${KVROUTE_DYNAMO_HOME}"
  if [ "${CI:-}" = "true" ]; then
    echo "KVROUTE_DYNAMO_PYTHONPATH=${KVROUTE_DYNAMO_PYTHONPATH}"
    # Fail early, with Python's words, if the extension does not load.
    PYTHONPATH="${KVROUTE_DYNAMO_PYTHONPATH}" python3 -I -c 'import sys; sys.path.insert(0, sys.argv[1]); import dynamo._core' "${KVROUTE_DYNAMO_PYTHONPATH}"
  fi
fi
