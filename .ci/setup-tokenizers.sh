# Sourced by .ci/run (set -euo pipefail is active): install the Python
# reference of the tokenizer parity tests (Hugging Face tokenizers,
# transformers and jinja2; no torch) into a virtual environment and export
# KVROUTE_TOKENIZERS_PYTHON, the interpreter tokenizer/live_test.go runs
# tokenizer/testdata/reference.py with.
#
# The versions are those the golden files under tokenizer/testdata were
# written with (see "versions" in each golden.json).
#
# With CI != true this only exports the variable when a previous run
# installed the environment, and changes nothing.

KVROUTE_TOKENIZERS_VENV="${KVROUTE_TOKENIZERS_VENV:-/opt/kvroute/tokenizers-venv}"
KVROUTE_TOKENIZERS_PACKAGES=(tokenizers==0.23.3 transformers==5.23.0 jinja2==3.1.6)

kvroute_tokenizers_ready() {
  [ -x "${KVROUTE_TOKENIZERS_VENV}/bin/python" ] &&
    "${KVROUTE_TOKENIZERS_VENV}/bin/python" -c "import tokenizers, transformers, jinja2" 2>/dev/null
}

if [ "${CI:-}" = "true" ] && ! kvroute_tokenizers_ready; then
  echo "installing ${KVROUTE_TOKENIZERS_PACKAGES[*]} into ${KVROUTE_TOKENIZERS_VENV}"
  if ! python3 -m venv "${KVROUTE_TOKENIZERS_VENV}" 2>/dev/null; then
    # Debian ships venv's ensurepip separately.
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "${KVROUTE_TOKENIZERS_VENV}"
  fi
  "${KVROUTE_TOKENIZERS_VENV}/bin/python" -m pip install --quiet --disable-pip-version-check \
    --only-binary=:all: "${KVROUTE_TOKENIZERS_PACKAGES[@]}"
fi

if kvroute_tokenizers_ready; then
  export KVROUTE_TOKENIZERS_PYTHON="${KVROUTE_TOKENIZERS_VENV}/bin/python"
  if [ "${CI:-}" = "true" ]; then
    echo "KVROUTE_TOKENIZERS_PYTHON=${KVROUTE_TOKENIZERS_PYTHON}"
  fi
fi
unset -f kvroute_tokenizers_ready
unset KVROUTE_TOKENIZERS_PACKAGES
