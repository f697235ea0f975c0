"""busway from Python: nodes of a brokerless message bus, blocking (`Node`) or asyncio (`AsyncNode`).

A node runs on threads of its own; what arrives waits in its queues, announced by one file
descriptor (`fileno()`), which the blocking calls wait on with `select` and `AsyncNode` watches
with the event loop's `add_reader`. Every call that waits lets go of the GIL.

    import busway
    node = busway.Node(2, connect=["tcp://127.0.0.1:7000"])
    node.wait_peer(1, timeout=5)
    node.send(1, b"hello")
    msg = node.recv(timeout=5)          # a Message: src, payload, group, is_request, reply()
    reply = node.call(1, b"ping", timeout=1)
    node.stop()
"""
from __future__ import annotations

import asyncio
import json
import select
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional

from ._busway import BuswayError, Event, Full, Message, Reply, _Node

__all__ = ["AsyncNode", "BuswayError", "Event", "Full", "Message", "Node", "Reply"]

#: Messages taken from the node and held here for `recv` before the node's own queue is left
#: unread (the node then stops reading its links: flow control, nothing dropped).
MESSAGES_HELD_MAX = 65536
#: Events held here for `next_event`; past it the oldest are dropped (counted in
#: `events_dropped_here`), except that finished calls always reach their callers.
EVENTS_HELD_MAX = 4096


def _toml(id: Optional[int], listen: Iterable[str], connect: Iterable[str], upstream: Optional[str],
          secret: Optional[str], toml: str) -> str:
    """A TOML text from the keyword settings, ahead of `toml` (a key given twice is an error)."""
    lines = []
    if id is not None:
        lines.append(f"id = {int(id)}")
    if listen:
        lines.append(f"listen = {json.dumps(list(listen))}")
    if connect:
        lines.append(f"connect = {json.dumps(list(connect))}")
    if upstream:
        lines.append(f"upstream = {json.dumps(upstream)}")
    if secret:
        lines.append(f"secret = {json.dumps(secret)}")
    return "\n".join(lines) + "\n" + toml


class _Base:
    """What `Node` and `AsyncNode` share: the node, and what was taken from it for the caller."""

    def __init__(self, id: Optional[int] = None, *, listen: Iterable[str] = (), connect: Iterable[str] = (),
                 upstream: Optional[str] = None, secret: Optional[str] = None, toml: str = ""):
        self._node = _Node(_toml(id, listen, connect, upstream, secret, toml))
        self._messages: Deque[Message] = deque()
        self._events: Deque[Event] = deque()
        self._next_token = 0
        #: Events dropped here because nobody read them.
        self.events_dropped_here = 0

    @property
    def id(self) -> int:
        """This node's bus id."""
        return self._node.id

    def fileno(self) -> int:
        """The descriptor that is readable while something waits in the node."""
        return self._node.fd()

    def listen_addrs(self) -> List[str]:
        """The addresses it listens on, with the ports it got."""
        return self._node.listen_addrs()

    def try_send(self, dst: int, payload: bytes) -> int:
        """Sends without waiting; raises `Full` if the queue to `dst` has no room."""
        return self._node.try_send(dst, payload)

    def join(self, group: str) -> None:
        """Joins `group`: its publishes reach this node from now on."""
        self._node.join(group)

    def leave(self, group: str) -> None:
        """Leaves `group`."""
        self._node.leave(group)

    def stats(self) -> Dict[str, int]:
        """The node's main counters."""
        return self._node.stats()

    def _take(self) -> None:
        """Moves what waits in the node here; finished calls go to `_call_done`."""
        while len(self._messages) < MESSAGES_HELD_MAX:
            batch = self._node.take_batch()
            if batch is None:
                break
            self._messages.extend(batch)
        while True:
            ev = self._node.take_event()
            if ev is None:
                break
            if ev.kind == "call_done" and self._call_done(ev):
                continue
            if len(self._events) >= EVENTS_HELD_MAX:
                self._events.popleft()
                self.events_dropped_here += 1
            self._events.append(ev)

    def _call_done(self, ev: Event) -> bool:
        """A finished call that someone here waits for: handed over (True), else kept as an event."""
        return False

    def _token(self) -> int:
        self._next_token += 1
        return self._next_token


class Node(_Base):
    """A node, used from blocking code (any thread).

    `Node(id, listen=[...], connect=[...], upstream=..., secret=..., toml="...")`: the keyword
    settings, or any key of `busway node -c FILE` in `toml`.
    """

    def wait_peer(self, id: int, timeout: float = 10.0) -> bool:
        """Waits up to `timeout` seconds for a link to `id`; True if it is up."""
        return self._node.wait_peer(id, timeout)

    def send(self, dst: int, payload: bytes) -> int:
        """Sends, waiting while the queue to `dst` is full; the message's number to `dst`."""
        return self._node.send(dst, payload)

    def send_batch(self, dst: int, payloads: List[bytes]) -> int:
        """Sends many in order, each copied once; the first one's number."""
        return self._node.send_batch(dst, payloads)

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message, waiting up to `timeout` seconds (None: for ever); None if none came."""
        return self._wait(self._messages, timeout)

    def next_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event (links, messages given up, groups), waiting up to `timeout` seconds."""
        return self._wait(self._events, timeout)

    def call(self, dst: int, payload: bytes, timeout: float = 5.0) -> Reply:
        """Calls `dst` and waits for the reply; raises `BuswayError` (kind `timeout`, ...)."""
        return self._node.call(dst, payload, timeout)

    def publish(self, group: str, payload: bytes) -> int:
        """Publishes to `group`; how many links it went to (0: no member known yet)."""
        return self._node.publish(group, payload)

    def multicast(self, ids: List[int], payload: bytes) -> int:
        """Sends one payload to each of `ids`; how many it was queued for."""
        return self._node.multicast(ids, payload)

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits until everything sent is acknowledged (or reported); True if so."""
        return self._node.flush(timeout)

    def stop(self, drain: float = 1.0) -> None:
        """Stops gracefully: up to `drain` seconds for acknowledgements, then closes the links."""
        self._node.stop(drain)

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait(self, queue: Deque, timeout: Optional[float]):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if queue:
                return queue.popleft()
            self._take()
            if queue:
                return queue.popleft()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            select.select([self.fileno()], [], [], left)


class AsyncNode(_Base):
    """A node for asyncio: `await node.recv()`, `await node.call(...)`, `await node.next_event()`.

    Made and used on one event loop. Sends that find a queue full, publishes and multicasts wait
    on the loop's default executor, not on the loop.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiters: List[asyncio.Future] = []
        self._calls: Dict[int, asyncio.Future] = {}
        self._paused = False

    def _watch(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.fileno(), self._readable)
        return self._loop

    def _readable(self) -> None:
        self._take()
        if len(self._messages) >= MESSAGES_HELD_MAX:
            # Nothing more is taken until the application reads: stop watching (the descriptor
            # would stay readable), start again in `recv`.
            self._loop.remove_reader(self.fileno())
            self._paused = True
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _call_done(self, ev: Event) -> bool:
        fut = self._calls.pop(ev.token, None)
        if fut is None:
            return False
        if not fut.done():
            if ev.reply is not None:
                fut.set_result(ev.reply)
            else:
                err = Full(ev.text) if ev.error_kind == "full" else BuswayError(ev.text)
                err.kind = ev.error_kind
                fut.set_exception(err)
        return True

    async def _next(self, queue: Deque):
        loop = self._watch()
        while True:
            if queue:
                item = queue.popleft()
                if self._paused and len(self._messages) < MESSAGES_HELD_MAX // 2:
                    self._paused = False
                    loop.add_reader(self.fileno(), self._readable)
                return item
            waiter = loop.create_future()
            self._waiters.append(waiter)
            await waiter

    async def recv(self) -> Message:
        """The next message."""
        return await self._next(self._messages)

    async def next_event(self) -> Event:
        """The next event."""
        return await self._next(self._events)

    async def wait_peer(self, id: int, timeout: float = 10.0) -> bool:
        """Waits up to `timeout` seconds for a link to `id`; True if it is up."""
        return await self._watch().run_in_executor(None, self._node.wait_peer, id, timeout)

    async def send(self, dst: int, payload: bytes) -> int:
        """Sends; a full queue is waited for off the loop."""
        try:
            return self._node.try_send(dst, payload)
        except Full:
            return await self._watch().run_in_executor(None, self._node.send, dst, payload)

    async def call(self, dst: int, payload: bytes, timeout: float = 5.0) -> bytes:
        """Calls `dst`; the reply's payload (raises `BuswayError` as `Node.call` does)."""
        loop = self._watch()
        token = self._token()
        fut = loop.create_future()
        self._calls[token] = fut
        self._node.call_start(dst, payload, timeout, token)
        return await fut

    async def publish(self, group: str, payload: bytes) -> int:
        """Publishes to `group` (off the loop); how many links it went to."""
        return await self._watch().run_in_executor(None, self._node.publish, group, payload)

    async def multicast(self, ids: List[int], payload: bytes) -> int:
        """Sends one payload to each of `ids` (off the loop); how many it was queued for."""
        return await self._watch().run_in_executor(None, self._node.multicast, ids, payload)

    async def stop(self, drain: float = 1.0) -> None:
        """Stops gracefully (off the loop)."""
        loop = self._watch()
        loop.remove_reader(self.fileno())
        await loop.run_in_executor(None, self._node.stop, drain)
