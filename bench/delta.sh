#!/usr/bin/env bash
# Delta benchmarks for the delta-engine issue, side by side in one run, over
# the local pipeline throttled to 110 MB/s (a gigabit link's payload):
#   1 GiB file, 5% overwritten in scattered 4-64 KiB chunks: ferry whole,
#   ferry --delta, ferry --delta --inplace, rsync --no-whole-file (default
#   delta), rsync --inplace --no-whole-file; 7 bytes inserted at 1 MiB;
#   --checksum of an unchanged 1 GiB file; and the re-sync with and without
#   ferry's signature cache, cold cache.
# usage: bench/delta.sh [--runs N] [--work DIR] [--ferry PATH] [--size-mb N]
set -euo pipefail
RUNS=3; WORK=${TMPDIR:-/tmp}/ferry-bench-delta; SIZE_MB=1024
FERRY=${FERRY:-$(dirname "$0")/../target/release/ferry}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2; shift 2;; --work) WORK=$2; shift 2;;
    --ferry) FERRY=$2; shift 2;; --size-mb) SIZE_MB=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 1;;
  esac
done
mkdir -p "$WORK"; cd "$WORK"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
if [ ! -f orig.$SIZE_MB ]; then
  head -c $((SIZE_MB << 20)) /dev/urandom > orig
  python3 - "$SIZE_MB" <<'PY'
import random, sys
size = int(sys.argv[1]) << 20
r = random.Random(5)
data = bytearray(open("orig", "rb").read())
ins = data[:]; ins[1 << 20:1 << 20] = b"INSERT!"
open("insert", "wb").write(ins); del ins
tot = 0
while tot < size * 5 // 100:
    n = r.randint(4096, 65536); off = r.randrange(0, size - n)
    data[off:off + n] = r.randbytes(n); tot += n
open("mangled", "wb").write(data)
PY
  touch orig.$SIZE_MB
fi
declare -A T W
run() { # name, new-file, command...
  local name=$1 new=$2; shift 2
  rm -f d.bin; cp orig d.bin; touch -d '2020-01-01' d.bin; drop
  local s e; s=$(date +%s.%N); "$@" > out.json 2>/dev/null; e=$(date +%s.%N)
  cmp -s "$new" d.bin || { echo "$name: RESULT DIFFERS" >&2; exit 1; }
  T[$name]="${T[$name]:-} $(echo "$e - $s" | bc -l)"
  W[$name]=$(grep -o '"bytes_wire":[0-9]*' out.json | cut -d: -f2 || true)
}
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
BW=110MB; RBW=107421   # 110 MB/s; a bare --bwlimit number is KiB/s (ferry and rsync)
for i in $(seq "$RUNS"); do
  run "mangled/ferry whole" mangled "$FERRY" sync --whole-file --bwlimit $BW --json mangled d.bin
  run "mangled/ferry --delta" mangled "$FERRY" sync --delta --bwlimit $BW --json mangled d.bin
  run "mangled/ferry --delta --inplace" mangled "$FERRY" sync --delta --inplace --bwlimit $BW --json mangled d.bin
  run "mangled/rsync delta" mangled rsync --no-whole-file --bwlimit=$RBW mangled d.bin
  run "mangled/rsync --inplace" mangled rsync --inplace --no-whole-file --bwlimit=$RBW mangled d.bin
  run "insert/ferry --delta" insert "$FERRY" sync --delta --bwlimit $BW --json insert d.bin
  run "insert/rsync delta" insert rsync --no-whole-file --bwlimit=$RBW insert d.bin
  # Signature cache: the destination was written by ferry with --sig-cache,
  # so the next delta need not read it to sign it.
  for c in without with; do
    rm -rf sigs d.bin; "$FERRY" sync -q --sig-cache sigs orig d.bin; drop
    args=(); [ $c = with ] && args=(--sig-cache sigs)
    s=$(date +%s.%N); "$FERRY" sync --delta --inplace "${args[@]}" --bwlimit $BW --json mangled d.bin > out.json; e=$(date +%s.%N)
    cmp -s mangled d.bin || { echo "cache $c: RESULT DIFFERS" >&2; exit 1; }
    T["cache/--delta --inplace, $c cache"]="${T["cache/--delta --inplace, $c cache"]:-} $(echo "$e - $s" | bc -l)"
  done
done
cp orig c.bin; touch -r orig c.bin; cat orig c.bin > /dev/null
s=$(date +%s.%N); "$FERRY" sync -q --checksum orig c.bin; e=$(date +%s.%N)
echo "# delta benchmarks: $(date -u +%F), $(nproc) cores, ${SIZE_MB} MiB file, link 110 MB/s (--bwlimit), runs=$RUNS, cold cache each run"
echo "# --checksum of an unchanged file (both copies hashed, warm): $(echo "$e - $s" | bc -l | cut -c1-5) s = $(echo "2 * $SIZE_MB / 1024 / ($e - $s)" | bc -l | cut -c1-4) GiB/s hashed"
echo
echo "| case | tool | median s | bytes_wire | % of file |"
echo "|---|---|---|---|---|"
printf '%s\n' "${!T[@]}" | sort | while read -r k; do
  w=${W[$k]:-}; pct=-
  [ -n "$w" ] && pct=$(echo "100 * $w / ($SIZE_MB * 1048576)" | bc -l | cut -c1-5)
  printf '| %s | %s | %.2f | %s | %s |\n' "${k%%/*}" "${k#*/}" "$(median "${T[$k]}")" "${w:--}" "$pct"
done
