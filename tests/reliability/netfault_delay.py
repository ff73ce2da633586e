"""Delay every packet NFQUEUE hands it by a fixed time, then let it through.

    python -m tests.reliability.netfault_delay QUEUE_NUM DELAY_MS

Run inside the network namespace whose iptables rule sends packets to the
queue (netlink queues are per namespace). The kernel here has no sch_netem,
so this is the 200 ms latency phase of test_network_faults.py. Verdicts are
given from a second thread when each packet is due, so packets overlap in
flight as on a slow link instead of queueing behind one another.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time


def main(queue_num: int, delay_ms: float) -> None:
    from netfilterqueue import NetfilterQueue

    delay = delay_ms / 1000
    held: list[tuple[float, int, object]] = []
    order = itertools.count()
    due_changed = threading.Condition()

    def on_packet(packet) -> None:
        with due_changed:
            heapq.heappush(held, (time.monotonic() + delay, next(order), packet))
            due_changed.notify()

    def release() -> None:
        while True:
            with due_changed:
                while not held:
                    due_changed.wait()
                due, _, packet = held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    due_changed.wait(wait)
                    continue
                heapq.heappop(held)
            packet.accept()  # type: ignore[attr-defined]

    threading.Thread(target=release, daemon=True).start()
    queue = NetfilterQueue()
    queue.bind(queue_num, on_packet)
    print("ready", flush=True)
    queue.run()


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
