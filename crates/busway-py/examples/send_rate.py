"""Python's send rate: N sequenced 16-byte messages one `send` at a time, then N more in
`send_batch`es of 1,000, to a receiver that checks their order, e.g.

    busway listen --id 7 --listen tcp://127.0.0.1:7400 --count 2000000 --verify &
    python examples/send_rate.py tcp://127.0.0.1:7400 7 1000000
"""
import struct
import sys
import time

import busway


def main():
    addr, to, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    payloads = [struct.pack("<Q", i) + b"\xa5" * 8 for i in range(2 * n)]
    with busway.Node(8, connect=[addr]) as node:
        assert node.wait_peer(to, 10), f"no link to {to} at {addr}"
        t = time.perf_counter()
        for p in payloads[:n]:
            node.send(to, p)
        assert node.flush(60)
        single = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for start in range(n, 2 * n, 1000):
            node.send_batch(to, payloads[start:start + 1000])
        assert node.flush(60)
        batch = n / (time.perf_counter() - t)
    print(f"one send per message: {single:,.0f} msg/s; send_batch of 1,000: {batch:,.0f} msg/s")


if __name__ == "__main__":
    main()
