#!/usr/bin/env bash
# Fuzz every target for a bounded time: `bash fuzz/run.sh [SECONDS_PER_TARGET]`
# (default 30). Installs cargo-fuzz if missing, builds all targets once
# (nightly, ASan, debug assertions), then runs each target on a scratch copy
# of its committed corpus (fuzz/corpus/<target>/ is never written), and
# prints per target the executions libFuzzer made. Exits non-zero if any
# target crashed, hung or failed an assertion; the input that did it is left
# in fuzz/artifacts/<target>/ (ignored by git) and its log is printed.
#
# Environment: FUZZ_TOOLCHAIN (default nightly), FUZZ_TARGETS (a space-
# separated subset), CARGO_TARGET_DIR (as for any cargo build).
set -euo pipefail

secs="${1:-30}"
case "$secs" in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2 ;;
esac
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
fuzz_dir="$(cd "$(dirname "$0")" && pwd)"
cd "$fuzz_dir/.."
start=$(date +%s)

if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
  echo "fuzz: the $toolchain toolchain is not installed (libFuzzer needs nightly: rustup toolchain install $toolchain)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
  targets="$FUZZ_TARGETS"
else
  targets=$(cd "$fuzz_dir/fuzz_targets" && ls -- *.rs | sed 's/\.rs$//')
fi

echo "fuzz: building $(echo "$targets" | wc -w) targets with +$toolchain"
cargo "+$toolchain" fuzz build

scratch=$(mktemp -d "${TMPDIR:-/tmp}/ferry-fuzz-run.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

failed=()
summary=()
for t in $targets; do
  corpus="$scratch/corpus/$t"
  mkdir -p "$corpus"
  if [ -d "$fuzz_dir/corpus/$t" ]; then
    cp -- "$fuzz_dir/corpus/$t"/* "$corpus/" 2>/dev/null || true
  fi
  log="$scratch/$t.log"
  echo "fuzz: $t for ${secs}s ($(ls "$corpus" | wc -l) seeds)"
  status=ok
  # -timeout: one input taking a minute is a hang (the targets' own
  # deadline, 20 s, usually fires first with a clearer message).
  if ! cargo "+$toolchain" fuzz run "$t" "$corpus" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 \
      -print_final_stats=1 >"$log" 2>&1; then
    status=FAILED
    failed+=("$t")
    echo "---- $t: what failed"
    grep -m 3 -A 2 -E "panicked at|^SUMMARY|ERROR: libFuzzer|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$log" || true
    echo "---- $t: last lines of its log"
    tail -n 40 "$log"
    echo "---- $t: reproducers in fuzz/artifacts/$t/ (run: cargo +$toolchain fuzz run $t <file>)"
    ls -l "$fuzz_dir/artifacts/$t" 2>/dev/null || true
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || true)
  if [ -z "$execs" ]; then
    execs=$(grep -o 'Done [0-9]* runs' "$log" | tail -n 1 | grep -o '[0-9]*' || true)
  fi
  found=$(ls "$corpus" | wc -l)
  line=$(printf '%-20s %-6s execs %-10s corpus %s' "$t" "$status" "${execs:-?}" "$found")
  echo "fuzz: $line"
  summary+=("$line")
done

echo
echo "fuzz: summary (${secs}s per target, $(($(date +%s) - start))s in all)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all targets passed"
