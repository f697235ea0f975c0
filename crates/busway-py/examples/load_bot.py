"""A load bot: many asyncio "players" calling a server on the bus at once, then a report of
calls/s and latency percentiles. Against any node that answers requests, e.g.

    busway node --id 1 --listen tcp://127.0.0.1:7000 &
    busway listen --id 2 --upstream tcp://127.0.0.1:7000 --echo &
    python examples/load_bot.py tcp://127.0.0.1:7000 2 --players 100 --seconds 5
"""
import argparse
import asyncio
import time

import busway


async def player(node, server, until, latencies):
    n = 0
    while time.monotonic() < until:
        t = time.perf_counter()
        await node.call(server, b"move %d" % n, 5.0)
        latencies.append(time.perf_counter() - t)
        n += 1


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("upstream")
    ap.add_argument("server", type=int)
    ap.add_argument("--id", type=int, default=900)
    ap.add_argument("--players", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    node = busway.AsyncNode(args.id, upstream=args.upstream)
    if not await node.wait_peer(args.server, 10):
        # Behind a relay the server is reached without a link of its own: try one call.
        await node.call(args.server, b"hello", 10)
    latencies = []
    start = time.monotonic()
    until = start + args.seconds
    await asyncio.gather(*(player(node, args.server, until, latencies) for _ in range(args.players)))
    secs = time.monotonic() - start
    latencies.sort()
    pct = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e6
    print(f"{len(latencies)} calls in {secs:.1f} s: {len(latencies) / secs:,.0f} calls/s, "
          f"p50 {pct(0.5):.0f} us, p99 {pct(0.99):.0f} us")
    await node.stop()


if __name__ == "__main__":
    asyncio.run(main())
