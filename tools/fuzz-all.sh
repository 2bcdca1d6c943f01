#!/usr/bin/env bash
# fuzz-all.sh runs every fuzz target of the kvroute module, one after
# another, for a set time each, and prints a Markdown table of the results
# (executions, new corpus entries, pass or failure) for RELIABILITY.md.
#
# Usage:
#   tools/fuzz-all.sh [-t DURATION] [-p WORKERS] [-o OUTDIR] [REGEXP]
#
#   -t DURATION  fuzzing time per target, as go test's -fuzztime
#                (default $FUZZTIME or 10m)
#   -p WORKERS   fuzzing worker processes per target, as go test's -parallel
#                (default $FUZZPARALLEL or 1)
#   -o OUTDIR    where each target's full go test output is kept
#                (default $FUZZOUT or a new temporary directory)
#   REGEXP       only targets whose "package.FuzzName" matches (grep -E)
#
# Targets run under `nice -n 19` so that a shared machine stays usable.
# A failing target leaves its crasher in the package's testdata/fuzz/<Target>/
# directory, where plain `go test` replays it from then on: commit it with
# the fix. The script exits non-zero when any target failed.
#
# This script is not part of .ci/run: CI replays every target's seed corpus
# and committed crashers through plain `go test`.
set -uo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-10m}
parallel=${FUZZPARALLEL:-1}
outdir=${FUZZOUT:-}
while getopts "t:p:o:h" opt; do
  case $opt in
  t) fuzztime=$OPTARG ;;
  p) parallel=$OPTARG ;;
  o) outdir=$OPTARG ;;
  *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
filter=${1:-.}
[ -n "$outdir" ] || outdir=$(mktemp -d -t kvroute-fuzz.XXXXXX)
mkdir -p "$outdir"

# Every "func FuzzX(f *testing.F)" in a _test.go file, as "dir FuzzX".
targets=$(grep -rE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . |
  sed -E 's#^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*).*#\1 \2#; s#^\./[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*).*#. \1#' |
  sort -u)

targets=$(echo "$targets" | while read -r dir name; do
  [ -n "$name" ] && echo "${dir#./}.$name" | grep -Eq -- "$filter" && echo "$dir $name"
done)
echo "fuzzing $(echo "$targets" | grep -c .) targets for $fuzztime each, $parallel worker(s), logs in $outdir" >&2
echo "| Package | Target | Time | Executions | New corpus entries | Result |"
echo "|---|---|---|---|---|---|"
failed=0
while read -r dir name; do
  [ -n "$name" ] || continue
  pkg=${dir#./}
  log="$outdir/$(echo "$pkg" | tr / _).$name.log"
  echo "== $pkg $name" >&2
  nice -n 19 go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" \
    -parallel "$parallel" "./$pkg" >"$log" 2>&1
  rc=$?
  # The last progress line: "fuzz: elapsed: 1m0s, execs: 123 (2/sec), new interesting: 4 (total: 9)".
  last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -n 1)
  execs=$(echo "$last" | sed -nE 's/.*execs: ([0-9]+).*/\1/p')
  newi=$(echo "$last" | sed -nE 's/.*new interesting: ([0-9]+).*/\1/p')
  if [ $rc -eq 0 ]; then
    result=pass
  else
    failed=1
    crasher=$(sed -nE 's#.*(testdata/fuzz/[^ ]+).*#\1#p' "$log" | head -n 1)
    result="FAIL${crasher:+ ($crasher)}"
  fi
  echo "| $pkg | $name | $fuzztime | ${execs:-0} | ${newi:-0} | $result |"
done <<<"$targets"
exit $failed
