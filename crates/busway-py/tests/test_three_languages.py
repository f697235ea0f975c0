"""C++, Python and Rust nodes on one bus: the C++ lobby (examples/cpp, built with CMake against
the C ABI), Python nodes of this package, and the `busway` command (Rust) as the hub, a
verifying receiver and a caller. Nodes of one host move their links to shared memory; the lobby
is killed and comes back."""
import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

import busway

ROOT = Path(__file__).resolve().parents[3]
BIN = os.environ.get("BUSWAY_BIN", str(ROOT / "target" / "release" / "busway"))
WAIT = 30.0


def lobby_binary(tmp_path_factory):
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        if os.environ.get("CI"):
            pytest.fail("cmake and a C++ compiler are needed (apt-get install cmake g++)")
        pytest.skip("cmake or a C++ compiler is missing")
    build = tmp_path_factory.mktemp("cpp")
    env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target"))
    subprocess.run(["cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(build)], check=True, env=env,
                   capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    return str(build / "lobby")


def first_line(p, prefix):
    line = p.stdout.readline()
    assert line.startswith(prefix), line
    return line[len(prefix):].strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lobby(lobby, hub, port):
    """The lobby on a fixed port, as a server has: after a restart, the nodes that had a direct
    link to it dial it there again and meet its new incarnation."""
    p = subprocess.Popen([lobby, "10", f"tcp://127.0.0.1:{port}", hub], stdout=subprocess.PIPE, text=True)
    first_line(p, "listening on ")
    return p


def call_until(node, dst, payload, want, deadline):
    """Calls until an answer comes (the lobby may still be coming up behind the hub)."""
    while True:
        try:
            r = node.call(dst, payload, timeout=1.0)
            assert want in r.payload, r.payload
            return r
        except busway.BuswayError:
            assert time.monotonic() < deadline, "no answer in time"


def test_cpp_python_and_rust_nodes_share_one_bus(tmp_path_factory):
    lobby = lobby_binary(tmp_path_factory)
    hub = subprocess.Popen([BIN, "node", "--id", "1", "--listen", "tcp://127.0.0.1:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hub_addr = first_line(hub, "listening on ")
    procs = [hub]
    try:
        lobby_port = free_port()
        cpp = start_lobby(lobby, hub_addr, lobby_port)
        procs.append(cpp)
        deadline = time.monotonic() + WAIT
        with busway.Node(20, upstream=hub_addr) as py:
            assert py.wait_peer(1, WAIT)
            # Python calls the C++ lobby; a Rust node (the command) does too.
            r = call_until(py, 10, b"enter 3 ann", b"welcome ann to 3", deadline)
            assert r.src == 10
            out = subprocess.run([BIN, "call", "--id", "21", "--upstream", hub_addr, "--to", "10", "enter 3 rust"],
                                 capture_output=True, text=True, timeout=WAIT)
            assert out.returncode == 0 and "welcome rust to 3" in out.stdout, out.stderr
            # The lobby publishes arrivals to the room's group: Python, a member, gets them.
            py.join("room-3")
            got = None
            while got is None:
                assert time.monotonic() < deadline + WAIT, "no arrival reached the room's member"
                py.call(10, b"enter 3 bob", timeout=WAIT)
                m = py.recv(timeout=0.2)
                if m is not None and m.group == "room-3":
                    got = m
            assert got.src == 10 and got.payload.endswith(b"entered")
            # Python to a Rust receiver that verifies order: 10,000 sequenced messages.
            listen = subprocess.Popen([BIN, "listen", "--id", "30", "--upstream", hub_addr, "--count", "10000",
                                       "--verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(listen)
            while not py.wait_peer(30, 0.1):
                try:
                    py.send(30, struct.pack("<Q", 0) + b"\xa5" * 8)
                    break
                except busway.BuswayError:
                    assert time.monotonic() < deadline + 2 * WAIT, "the receiver never became reachable"
            else:
                py.send(30, struct.pack("<Q", 0) + b"\xa5" * 8)
            py.send_batch(30, [struct.pack("<Q", i) + b"\xa5" * 8 for i in range(1, 10000)])
            out, err = listen.communicate(timeout=WAIT)
            assert listen.returncode == 0, err
            assert "received 10000, missing 0, duplicates 0, out-of-order 0" in out
            # One host: links moved to shared memory.
            assert py.stats()["shm_channels"] >= 1, py.stats()
            # The lobby is killed: Python hears it go; a new lobby answers again.
            cpp.kill()
            cpp.wait()
            while True:
                ev = py.next_event(timeout=WAIT)
                assert ev is not None, "no peer_down for the lobby"
                if ev.kind == "peer_down" and ev.peer == 10:
                    break
            cpp = start_lobby(lobby, hub_addr, lobby_port)
            procs.append(cpp)
            call_until(py, 10, b"enter 4 dee", b"welcome dee to 4", time.monotonic() + WAIT)
    finally:
        for p in procs:
            p.kill()
            p.wait()
