#!/usr/bin/env bash
# Re-creates the golden store data of package discovery/dynamo from real
# Dynamo 1.6.1 mocker workers:
#   testdata/filestore/v1/...  the files a mocker writes under DYN_FILE_KV
#                              (--discovery-backend file), names and values as written
#   testdata/etcd.json         the keys, leases and values a mocker puts into etcd
#                              (--discovery-backend etcd)
# Needs a Python that runs `python -m dynamo.mocker` (pip install --no-deps
# ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1, plus their runtime dependencies)
# and an etcd server (Debian's etcd-server, or KVROUTE_ETCD).
#
# Usage, from the repository root:
#   KVROUTE_DYNAMO_PYTHON=/path/to/venv/bin/python discovery/dynamo/testdata/capture.sh
# The mocker serves a tokenizer-only model the test writes itself (model "tiny",
# blocks of 16 tokens, 800 cache blocks); every address is on 127.0.0.1 and every
# process is stopped when the capture ends.
set -euo pipefail
cd "$(dirname "$0")/.."
KVROUTE_DYNAMO_CAPTURE=1 KVROUTE_EXTERNAL_TESTS=1 go test -count=1 -run '^TestCaptureStore$' -v . 
