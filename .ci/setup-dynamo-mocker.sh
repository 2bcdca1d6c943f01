# Sourced by .ci/run (set -euo pipefail is active): install NVIDIA Dynamo's
# Python package (the PyPI wheel ai-dynamo, whose `python -m dynamo.mocker`
# is a simulated engine worker) for the live tests of discovery/dynamo,
# which start mocker workers and follow what they register in Dynamo's
# discovery store.
#
# ai-dynamo is installed --no-deps (its declared dependencies pull in a
# planner package that cannot be installed), with only the modules the
# mocker imports, pinned. Its Rust core, ai-dynamo-runtime, is installed by
# .ci/setup-dynamo.sh (KVROUTE_DYNAMO_PYTHONPATH); the tests put both
# directories on PYTHONPATH.
#
# Exports KVROUTE_DYNAMO_MOCKER_PYTHONPATH (the install directory). With
# CI != true this only exports it when a previous run installed it, and
# changes nothing.

KVROUTE_DYNAMO_MOCKER_VERSION="1.6.1"
KVROUTE_DYNAMO_MOCKER_HOME="${KVROUTE_DYNAMO_MOCKER_HOME:-/opt/kvroute/ai-dynamo-${KVROUTE_DYNAMO_MOCKER_VERSION}}"

if [ "${CI:-}" = "true" ] && [ ! -e "${KVROUTE_DYNAMO_MOCKER_HOME}/dynamo/mocker/main.py" ]; then
  echo "installing ai-dynamo==${KVROUTE_DYNAMO_MOCKER_VERSION} into ${KVROUTE_DYNAMO_MOCKER_HOME}"
  mkdir -p "${KVROUTE_DYNAMO_MOCKER_HOME}"
  kvroute_pip=(python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all:
    --target "${KVROUTE_DYNAMO_MOCKER_HOME}")
  kvroute_deps=(uvloop==0.23.0 msgspec==0.22.0 PyYAML==6.0.3 packaging==26.3 pydantic==2.14.3
    pydantic_core==2.50.4 typing_extensions==4.16.0 typing-inspection==0.4.5 annotated-types==0.8.0)
  # Debian's system Python refuses installs without --break-system-packages
  # (PEP 668); --target never touches the system site-packages.
  kvroute_break=()
  if ! "${kvroute_pip[@]}" --no-deps "ai-dynamo==${KVROUTE_DYNAMO_MOCKER_VERSION}" 2>/dev/null; then
    kvroute_break=(--break-system-packages)
    "${kvroute_pip[@]}" "${kvroute_break[@]}" --no-deps "ai-dynamo==${KVROUTE_DYNAMO_MOCKER_VERSION}"
  fi
  "${kvroute_pip[@]}" "${kvroute_break[@]}" --no-deps "${kvroute_deps[@]}"
  unset kvroute_pip kvroute_deps kvroute_break
fi

if [ -e "${KVROUTE_DYNAMO_MOCKER_HOME}/dynamo/mocker/main.py" ]; then
  export KVROUTE_DYNAMO_MOCKER_PYTHONPATH="${KVROUTE_DYNAMO_MOCKER_HOME}"
  echo "KVROUTE_DYNAMO_MOCKER_PYTHONPATH=${KVROUTE_DYNAMO_MOCKER_PYTHONPATH}"
fi
