"""Shared fixtures of the Python tests: real ps-server processes.

The shards are started from $SHARDTRAIN_BUILD_DIR/bin/ps-server (default:
<repo>/build) on 127.0.0.1 with ports the kernel picks (--listen
127.0.0.1:0, reported through --port_file), and killed by PID when the test
ends. Every wait is bounded.

    def test_something(start_shards):
        cluster = start_shards(2, ["--mode=sync", "--lr=0.5"], num_workers=2)
        client = shardtrain.Client(cluster.addresses, 0, 2)

Certificates for TLS tests come from scripts/make-certs.sh (the `certs`
fixture: a directory with ca.pem, server.pem/.key, client.pem/.key, token).
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("SHARDTRAIN_BUILD_DIR", REPO / "build"))
PS_SERVER = BUILD_DIR / "bin" / "ps-server"

# The longest a shard may take to start serving.
START_TIMEOUT_S = 30.0


class ShardCluster:
    """Shard processes of one job; addresses in shard order."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.processes = []
        self.addresses = []
        self.metrics_ports = []
        self.logs = []

    def log(self, shard):
        """The shard's log so far (for assertion messages)."""
        try:
            return self.logs[shard].read_text(errors="replace")
        except OSError:
            return ""

    def stop(self):
        """Kills every shard by its PID and reaps it (bounded wait)."""
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _read_ports(port_file):
    try:
        text = port_file.read_text()
    except OSError:
        return None
    fields = text.split()
    if len(fields) < 2 or not text.endswith("\n"):
        return None
    return int(fields[0]), int(fields[1])


@pytest.fixture
def start_shards(tmp_path):
    """start_shards(num_shards=1, flags=(), num_workers=1) -> ShardCluster.

    `flags` are extra ps-server flags (they come last, so they override the
    defaults here). Raises if a shard is not serving within
    START_TIMEOUT_S. Every shard started is killed at teardown.
    """
    if not PS_SERVER.exists():
        pytest.fail(f"{PS_SERVER} is missing: build ps-server first (SHARDTRAIN_BUILD_DIR)")
    clusters = []

    def start(num_shards=1, flags=(), num_workers=1):
        cluster = ShardCluster(tmp_path / f"cluster{len(clusters)}")
        cluster.directory.mkdir()
        clusters.append(cluster)
        port_files = []
        for shard in range(num_shards):
            port_file = cluster.directory / f"shard{shard}.ports"
            log = cluster.directory / f"shard{shard}.log"
            argv = [
                str(PS_SERVER),
                "--listen=127.0.0.1:0",
                "--metrics_listen=127.0.0.1:0",
                f"--port_file={port_file}",
                f"--shard_index={shard}",
                f"--num_shards={num_shards}",
                f"--num_workers={num_workers}",
                *flags,
            ]
            with open(log, "wb") as out:
                cluster.processes.append(
                    subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL))
            cluster.logs.append(log)
            port_files.append(port_file)
        deadline = time.monotonic() + START_TIMEOUT_S
        for shard, port_file in enumerate(port_files):
            while True:
                ports = _read_ports(port_file)
                if ports is not None:
                    break
                process = cluster.processes[shard]
                if process.poll() is not None:
                    raise RuntimeError(f"shard {shard} exited with {process.returncode}:\n"
                                       f"{cluster.log(shard)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"shard {shard} did not serve within "
                                       f"{START_TIMEOUT_S} s:\n{cluster.log(shard)}")
                time.sleep(0.02)
            cluster.addresses.append(f"127.0.0.1:{ports[0]}")
            cluster.metrics_ports.append(ports[1])
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A CA, shard and client certificates for 127.0.0.1, and a token."""
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run([str(REPO / "scripts" / "make-certs.sh"), str(directory)], check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    return directory
