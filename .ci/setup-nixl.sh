# Sourced by .ci/run (set -euo pipefail is active): install NVIDIA NIXL from
# the PyPI wheel nixl-cu12 and export what the transfer/nixl tests need to
# load libnixl_capi.so and its plugins (UCX, POSIX).
#
# The wheel carries NIXL's shared libraries; its Python dependencies are not
# needed by the C libraries, hence --no-deps. In nixl-cu12 1.5.1 libnixl.so,
# libnixl_capi.so and the UCX and POSIX plugins need no CUDA library (ldd
# shows every dependency resolved from the wheel), so no libcuda stub is
# needed; only the GDS/GPUNETIO/LIBFABRIC plugins want CUDA, and NIXL skips
# plugins it cannot load.
#
# With CI != true this only exports the variables when a previous run
# installed NIXL, and changes nothing.

KVROUTE_NIXL_VERSION="1.5.1"
KVROUTE_NIXL_HOME="${KVROUTE_NIXL_HOME:-/opt/kvroute/nixl-cu12-${KVROUTE_NIXL_VERSION}}"

kvroute_nixl_libdir() {
  # The wheel installs its libraries and plugins under .nixl_cu12.mesonpy.libs.
  local d="${KVROUTE_NIXL_HOME}/.nixl_cu12.mesonpy.libs"
  if [ -f "$d/libnixl_capi.so" ]; then
    echo "$d"
  fi
}

if [ "${CI:-}" = "true" ] && [ -z "$(kvroute_nixl_libdir)" ]; then
  echo "installing nixl-cu12==${KVROUTE_NIXL_VERSION} into ${KVROUTE_NIXL_HOME}"
  mkdir -p "${KVROUTE_NIXL_HOME}"
  kvroute_pip=(python3 -m pip install --quiet --disable-pip-version-check --no-deps
    --only-binary=:all: --target "${KVROUTE_NIXL_HOME}" "nixl-cu12==${KVROUTE_NIXL_VERSION}")
  # Debian's system Python refuses installs without --break-system-packages
  # (PEP 668); --target never touches the system site-packages.
  if ! "${kvroute_pip[@]}" 2>/dev/null; then
    "${kvroute_pip[@]}" --break-system-packages
  fi
  unset kvroute_pip
fi

if [ -n "$(kvroute_nixl_libdir)" ]; then
  NIXL_LIB_DIR="$(kvroute_nixl_libdir)"
  export NIXL_LIB_DIR
  export NIXL_PLUGIN_DIR="${NIXL_LIB_DIR}/plugins"
  if [ "${CI:-}" = "true" ]; then
    echo "NIXL_LIB_DIR=${NIXL_LIB_DIR}"
    # Fail early, with the loader's words, if a dependency is missing.
    if ldd "${NIXL_LIB_DIR}/libnixl_capi.so" "${NIXL_PLUGIN_DIR}/libplugin_UCX.so" \
      "${NIXL_PLUGIN_DIR}/libplugin_POSIX.so" | grep 'not found'; then
      echo "setup-nixl: unresolved dependencies above" >&2
      return 1
    fi
  fi
fi
unset -f kvroute_nixl_libdir
