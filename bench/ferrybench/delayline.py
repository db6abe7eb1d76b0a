"""A delay line for kernels without netem (sch_netem): packets arriving on
a namespace's veth end are held in the kernel's NFQUEUE and released, in
order, DELAY ms after they arrived; with --loss P each frame is lost with
probability P. Run inside the receiving namespace, one per direction:

    iptables -t raw -A PREROUTING -i DEV -j NFQUEUE --queue-num 0
    python3 delayline.py --queue 0 --delay-ms 50 [--loss 0.001]

On the receiving side, because there the packets are no longer charged to
the sending socket: held on the sender's way out they would count against
TCP Small Queues (about 1 ms of data outside the socket) and the sending
buffer, and throughput would collapse (netem orphans what it delays for
this reason). Only packet ids and lengths cross into this process (the
first 128 bytes of each packet are copied): the packets stay in the
kernel, and one batch verdict accepts everything that has waited long
enough, so a Python loop keeps up with 1 Gbit/s of GSO super-packets
(veth passes them whole, up to 64 KiB). Without this process the rule has
no listener and drops every packet: a missing delay line breaks the link
rather than hiding.

Loss counts frames, not super-packets: a packet of n full frames is lost
with probability 1 - (1-P)^n, so TCP meets one loss event per 1/P frames,
as on a wire with independent losses; each event costs a whole super-packet
(~15 frames at 1 Gbit/s), so more bytes are lost than P of them. netem
with GSO on drops each super-packet with probability P instead (fewer
events).

Prints one JSON line of counters on SIGTERM/SIGINT (stdout) and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_PAYLOAD, NFQA_CAP_LEN = 1, 2, 10, 13
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_PACKET = 2
NFQA_CFG_F_GSO = 4
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_DROP, NF_ACCEPT = 0, 1
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
FRAME_PAYLOAD = 1448  # TCP payload of a full 1514-byte frame (timestamps on)
HEADERS = 52          # IP + TCP with timestamps (the packet as queued has no Ethernet header)


def attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


class Queue:
    def __init__(self, num: int, maxlen: int):
        self.num, self.seq = num, 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.request(NFQNL_MSG_CONFIG, attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, 0)), ack=True)
        self.request(NFQNL_MSG_CONFIG, attr(NFQA_CFG_PARAMS, struct.pack(">IB", 128, NFQNL_COPY_PACKET))
                     + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
                     + attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO))
                     + attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO)), ack=True)

    def request(self, msg: int, attrs: bytes, ack: bool = False) -> None:
        self.seq += 1
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.num)) + attrs
        hdr = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg,
                          NLM_F_REQUEST | (NLM_F_ACK if ack else 0), self.seq, 0)
        self.sock.send(hdr + body)
        while ack:  # its answer (a packet that comes first is accepted later by a batch verdict)
            data = self.sock.recv(1 << 20)
            _, kind, _, seq, _ = struct.unpack_from("=IHHII", data)
            if kind == NLMSG_ERROR and seq == self.seq:
                err = struct.unpack_from("=i", data, 16)[0]
                if err:
                    raise OSError(-err, f"nfqueue config: {os.strerror(-err)}")
                return

    def verdict(self, pid: int, verdict: int, batch: bool = False) -> None:
        self.request(NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT,
                     attr(NFQA_VERDICT_HDR, struct.pack(">II", verdict, pid)))

    def packets(self, data: bytes, lengths: bool):
        """(id, length) of each queued packet in one recv(); length 0
        unless asked for (it costs a walk over the attributes)."""
        off = 0
        while off + 16 <= len(data):
            n, kind = struct.unpack_from("=IH", data, off)
            if n < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                pid, length, a = None, 0, off + 20
                while a + 4 <= off + n:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    atype &= 0x3FFF
                    if atype == NFQA_PACKET_HDR:  # the kernel puts it first
                        pid = struct.unpack_from(">I", data, a + 4)[0]
                        if not lengths:
                            break
                    elif atype == NFQA_CAP_LEN:  # only there when longer than the copy
                        length = struct.unpack_from(">I", data, a + 4)[0]
                    elif atype == NFQA_PAYLOAD and not length:
                        length = alen - 4
                    a += (alen + 3) & ~3
                if pid is not None:
                    yield pid, length
            off += (n + 3) & ~3


def run(queue: int, delay: float, loss: float, maxlen: int) -> dict:
    t0 = time.monotonic()
    q = Queue(queue, maxlen)
    held: collections.deque = collections.deque()  # (due, packet id)
    stats = {"packets": 0, "frames": 0, "lost_packets": 0, "lost_frames": 0, "max_held": 0}
    stop = []
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.append(1))
    keep = math.log1p(-loss) if loss > 0 else 0.0  # log of P(a frame survives)
    rnd = random.Random()
    while not stop:
        now = time.monotonic()
        if held and held[0][0] <= now:
            last = None
            while held and held[0][0] <= now:
                last = held.popleft()[1]
            q.verdict(last, NF_ACCEPT, batch=True)
        wait = max(0.0, held[0][0] - time.monotonic()) if held else 0.2
        try:
            if not select.select([q.sock], [], [], wait)[0]:
                continue
        except InterruptedError:
            continue
        now = time.monotonic()
        while True:  # everything queued by now, one recv each, then back to the verdicts
            try:
                data = q.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            for pid, length in q.packets(data, bool(keep)):
                frames = max(1, -(-(length - HEADERS) // FRAME_PAYLOAD)) if keep else 1
                stats["packets"] += 1
                stats["frames"] += frames
                if keep and rnd.random() >= math.exp(keep * frames):
                    stats["lost_packets"] += 1
                    stats["lost_frames"] += frames
                    q.verdict(pid, NF_DROP)
                    continue
                held.append((now + delay, pid))
        stats["max_held"] = max(stats["max_held"], len(held))
    if held:  # let what is in flight go rather than drop it at exit
        q.verdict(held[-1][1], NF_ACCEPT, batch=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    stats["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 2)
    stats["seconds"] = round(time.monotonic() - t0, 2)
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ferrybench.delayline", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", type=int, default=0, help="NFQUEUE number (default 0)")
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to every packet")
    p.add_argument("--loss", type=float, default=0.0, help="probability that a frame is lost (0.001: 0.1%%)")
    p.add_argument("--maxlen", type=int, default=100000, help="packets the kernel may hold (default 100000)")
    a = p.parse_args(argv)
    stats = run(a.queue, a.delay_ms / 1000, a.loss, a.maxlen)
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
