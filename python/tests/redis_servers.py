"""A ``redis-server`` of the tests' own on a free loopback port, or a 3-master Redis Cluster
on loopback ports, started and stopped by the tests (as the Rust tests' support does).
``PACELINE_REDIS_SERVER=valkey-server`` and ``PACELINE_REDIS_CLI=valkey-cli`` run them on
Valkey instead."""

import os
import shutil
import socket
import subprocess
import tempfile
import time


def server_binary():
    return os.environ.get("PACELINE_REDIS_SERVER", "redis-server")


def cli_binary():
    return os.environ.get("PACELINE_REDIS_CLI", "redis-cli")


def have(binary):
    return shutil.which(binary) is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Server:
    """A server on a loopback port, killed by ``stop()``; ``start()`` again on the same
    port (a restart: its state and script cache are gone)."""

    def __init__(self, port=None, binary=None, args=(), cli=None):
        self.port = port or free_port()
        self.binary = binary or server_binary()
        self.cli_binary = cli or (
            "valkey-cli" if self.binary.startswith("valkey") and have("valkey-cli") else cli_binary()
        )
        self.args = list(args)
        self.proc = None
        self.start()

    def start(self):
        # On loopback, nothing saved to disk.
        options = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [self.binary, *options, *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                if self.cli("PING").strip() == "PONG":
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.binary} did not start on port {self.port}")

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self):
        self.stop()
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def cli(self, *args):
        out = subprocess.run(
            [self.cli_binary, "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout


class Cluster:
    """Three masters, no replicas, each node in a directory of its own."""

    def __init__(self, binary=None, cli=None):
        self.binary = binary or server_binary()
        self.cli_binary = cli or cli_binary()
        self.dir = tempfile.mkdtemp(prefix="paceline-py-cluster-")
        self.nodes = []
        try:
            while len(self.nodes) < 3:
                port = free_port()
                # A node also listens on its port + 10000 (the cluster bus).
                if port > 55_000 or not _port_free(port + 10_000):
                    continue
                self.nodes.append(self._node(port))
            out = subprocess.run(
                [self.cli_binary, "--cluster", "create"]
                + [f"127.0.0.1:{n.port}" for n in self.nodes]
                + ["--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if out.returncode != 0:
                raise RuntimeError(f"cluster create failed: {out.stdout} {out.stderr}")
            self.wait_until_ok()
        except BaseException:
            self.stop()
            raise

    def _node(self, port):
        return Server(
            port,
            binary=self.binary,
            cli=self.cli_binary,
            args=[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--cluster-node-timeout",
                "1000",
                "--dir",
                self.dir,
            ],
        )

    def wait_until_ok(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not become ok")

    def stop(self):
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
