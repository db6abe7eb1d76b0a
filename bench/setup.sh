#!/usr/bin/env bash
# Install what the benchmark suite runs against: the peer tools from Debian
# packages, and matplotlib (charts) from PyPI. Idempotent; run as root.
#   bash bench/setup.sh            # everything
#   bash bench/setup.sh --no-pip   # skip matplotlib (tables and JSON still work)
set -euo pipefail
PKGS="rsync mbuffer nbdkit libnbd-bin openssh-server openssh-client qemu-utils zstd iproute2 bc time e2fsprogs tar iperf3 iputils-ping iptables"
pip=1
[ "${1:-}" = "--no-pip" ] && pip=0
if [ "$(id -u)" != 0 ]; then
  echo "bench/setup.sh: run as root (apt-get)" >&2
  exit 1
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "bench/setup.sh: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps out the extras qemu-utils and nbdkit pull in
  apt-get install -y -qq --no-install-recommends $missing
else
  echo "bench/setup.sh: Debian packages already installed"
fi
# the Debian openssh-server package may start a system sshd; the suite does
# not use it (it starts its own in a namespace) and leaves it alone.
if [ $pip = 1 ]; then
  if python3 -c "import matplotlib" 2>/dev/null; then
    echo "bench/setup.sh: matplotlib already installed"
  else
    python3 -m pip install --quiet matplotlib \
      || python3 -m pip install --quiet --break-system-packages matplotlib
  fi
fi
python3 - <<'PY'
import sys
assert sys.version_info >= (3, 11), "the suite needs Python 3.11+"
PY
echo "bench/setup.sh: ok"
