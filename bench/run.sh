#!/usr/bin/env bash
# Run the ferry benchmark suite: bash bench/run.sh [--quick] [--report BENCHMARKS.md] [scenario ...]
# See bench/README.md. Needs python3 (3.11+); matplotlib for charts (bench/setup.sh).
#
# The Python side removes its namespaces and processes itself; this trap is
# the second line for when Python dies hard (SIGKILL, crash): it ends the
# processes Python recorded, by pid, and deletes the two namespaces by name.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export FERRYBENCH_PIDFILE=$(mktemp /tmp/ferrybench-pids.XXXXXX)
cleanup() {
  if [ -s "$FERRYBENCH_PIDFILE" ]; then
    while read -r pid; do [ -n "$pid" ] && kill "$pid" 2>/dev/null; done < "$FERRYBENCH_PIDFILE"
  fi
  rm -f "$FERRYBENCH_PIDFILE"
  if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    for ns in ferrybench-a ferrybench-b; do
      ip netns list 2>/dev/null | grep -qw "$ns" && ip netns del "$ns" 2>/dev/null
    done
  fi
  return 0
}
trap cleanup EXIT
# Foreground on purpose: Ctrl-C reaches Python (KeyboardInterrupt, it cleans
# up), and bash runs the EXIT trap after Python has returned.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m ferrybench "$@"
