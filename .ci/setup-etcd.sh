# Sourced by .ci/run (set -euo pipefail is active): install an etcd server
# from Debian's etcd-server package and export KVROUTE_ETCD, the binary the
# discovery/etcd tests start on loopback (one member, a temporary data
# directory, killed when the test ends).
#
# With CI != true this only exports the variable when etcd is installed,
# and changes nothing.

if [ "${CI:-}" = "true" ] && ! command -v etcd >/dev/null 2>&1; then
  echo "installing etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
  # The package enables a system service; the tests run their own server.
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
fi

if command -v etcd >/dev/null 2>&1; then
  KVROUTE_ETCD="$(command -v etcd)"
  export KVROUTE_ETCD
  echo "etcd: ${KVROUTE_ETCD}"
fi
