#!/usr/bin/env bash
# Local benchmarks for the foundation issue, side by side in one run:
#   tree:   1024 files x 1 MiB (random), initial copy with ferry, cp -a,
#           rsync -a (warm and cold cache), and ferry's unchanged re-run;
#   sparse: an 8 GiB image holding 300 MiB of data (some of it written
#           zeros), ferry vs qemu-img convert -O raw vs cp --sparse=always.
# Runs alternate tools (A B C A B C ...) because these VMs drift; the table
# gives the median of each and its ratio to ferry.
#
# usage: bench/local.sh [--runs N] [--work DIR] [--ferry PATH] [--quick]
set -euo pipefail
RUNS=3
WORK=${TMPDIR:-/tmp}/ferry-bench-local
FERRY=${FERRY:-$(dirname "$0")/../target/release/ferry}
FILES=1024; FILE_KB=1024; IMG_GB=8; IMG_DATA_MB=300
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --ferry) FERRY=$2; shift 2;;
    --quick) FILES=64; FILE_KB=256; IMG_GB=1; IMG_DATA_MB=40; RUNS=1; shift;;
    *) echo "unknown option $1" >&2; exit 1;;
  esac
done
[ -x "$FERRY" ] || { echo "ferry binary not found at $FERRY (cargo build --release)" >&2; exit 1; }
mkdir -p "$WORK"
CAN_DROP=0
if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then CAN_DROP=1; fi
drop() { sync; [ $CAN_DROP = 1 ] && echo 3 > /proc/sys/vm/drop_caches || true; }

# --- data -------------------------------------------------------------------
if [ ! -f "$WORK/tree.done.$FILES.$FILE_KB" ]; then
  rm -rf "$WORK/tree"; mkdir -p "$WORK/tree"
  python3 - "$WORK/tree" "$FILES" "$FILE_KB" <<'PY'
import os, random, sys
root, n, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(1024)
for i in range(n):
    d = os.path.join(root, f"d{i // 64:02d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:04d}"), "wb") as f:
        f.write(rnd.randbytes(kb * 1024))
PY
  touch "$WORK/tree.done.$FILES.$FILE_KB"
fi
if [ ! -f "$WORK/img.done.$IMG_GB.$IMG_DATA_MB" ]; then
  python3 - "$WORK/sparse.img" "$IMG_GB" "$IMG_DATA_MB" <<'PY'
import os, random, sys
path, gb, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(8)
size = gb << 30
with open(path, "wb") as f:
    f.truncate(size)
    written = 0
    i = 0
    while written < mb << 20:
        ext = rnd.choice([64, 256, 1024, 4096]) << 10
        off = rnd.randrange(0, size - ext) & ~0xFFFF
        f.seek(off)
        # one extent in five is written zeros (allocated, but all zero)
        f.write(bytes(ext) if i % 5 == 0 else rnd.randbytes(ext))
        written += ext
        i += 1
PY
  touch "$WORK/img.done.$IMG_GB.$IMG_DATA_MB"
fi

declare -A T
run() { # name, command...
  local name=$1; shift
  local s e
  s=$(date +%s.%N); "$@" >/dev/null 2>&1 || { echo "$name FAILED: $*" >&2; exit 1; }; e=$(date +%s.%N)
  T[$name]="${T[$name]:-} $(echo "$e - $s" | bc -l)"
}
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }

for i in $(seq "$RUNS"); do
  for cache in warm cold; do
    for tool in ferry cp rsync; do
      rm -rf "$WORK/out"; drop
      [ $cache = warm ] && cat "$WORK"/tree/*/* > /dev/null
      case $tool in
        ferry) run "tree/$cache/ferry" "$FERRY" sync "$WORK/tree/" "$WORK/out" -q;;
        cp) run "tree/$cache/cp -a" cp -a "$WORK/tree" "$WORK/out";;
        rsync) run "tree/$cache/rsync -a" rsync -a "$WORK/tree/" "$WORK/out";;
      esac
    done
  done
  rm -rf "$WORK/out"; "$FERRY" sync "$WORK/tree/" "$WORK/out" -q
  run "tree/unchanged/ferry" "$FERRY" sync "$WORK/tree/" "$WORK/out" -q
  run "tree/unchanged/rsync -a" rsync -a "$WORK/tree/" "$WORK/out"
  for tool in ferry qemu-img cp; do
    rm -f "$WORK/img.out"; drop
    case $tool in
      ferry) run "sparse/cold/ferry" "$FERRY" sync "$WORK/sparse.img" "$WORK/img.out" -q;;
      qemu-img) run "sparse/cold/qemu-img convert" qemu-img convert -f raw -O raw "$WORK/sparse.img" "$WORK/img.out";;
      cp) run "sparse/cold/cp --sparse=always" cp --sparse=always "$WORK/sparse.img" "$WORK/img.out";;
    esac
  done
done
cmp "$WORK/sparse.img" "$WORK/img.out"
"$FERRY" sync "$WORK/sparse.img" "$WORK/img.out" --checksum -q
echo "# local benchmarks: $(date -u +%F) $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB, runs=$RUNS, cold=drop_caches:$CAN_DROP"
echo "# tree: $FILES files x $FILE_KB KiB; sparse: ${IMG_GB} GiB image, ~${IMG_DATA_MB} MiB data; allocated src $(du -k "$WORK/sparse.img" | cut -f1) KiB, ferry copy $(rm -f "$WORK/img.out"; "$FERRY" sync "$WORK/sparse.img" "$WORK/img.out" -q; du -k "$WORK/img.out" | cut -f1) KiB"
echo
echo "| scenario | tool | median s | runs | x ferry |"
echo "|---|---|---|---|---|"
for k in $(printf '%s\n' "${!T[@]}" | sort); do :; done
printf '%s\n' "${!T[@]}" | sort | while read -r k; do
  sc=${k%/*}; tool=${k##*/}
  m=$(median "${T[$k]}")
  f=$(median "${T[$sc/ferry]}")
  printf '| %s | %s | %.3f | %s | %.2f |\n' "$sc" "$tool" "$m" "$(echo ${T[$k]} | wc -w)" "$(echo "$m / $f" | bc -l)"
done
