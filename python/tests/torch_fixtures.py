"""Helpers for the tests of shardtrain-run and shardtrain.torch: where the
build is, and a launcher run whose output lands in files the test reads.

    run = LauncherRun(tmp_path, ["--workers", "2", "--", sys.executable, "w.py"])
    run.wait_for(r"worker 1: pid (\\d+)")
    assert run.wait(timeout=30) == 0
"""

import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_DIR = os.environ.get("SHARDTRAIN_BUILD_DIR") or os.path.join(REPO, "build")
SHARDTRAIN_RUN = os.path.join(REPO, "scripts", "shardtrain-run")
EXAMPLE = os.path.join(REPO, "examples", "torch_fmnist_cnn.py")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class LauncherRun:
    """One shardtrain-run process; its stdout and stderr go to files under
    `directory`. stop() kills it (by PID) if it still runs."""

    def __init__(self, directory, args, env=None):
        self.stdout_path = os.path.join(str(directory), "launcher.out")
        self.stderr_path = os.path.join(str(directory), "launcher.err")
        self._stdout = open(self.stdout_path, "wb")
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, SHARDTRAIN_RUN, "--build-dir", BUILD_DIR, *args],
            stdout=self._stdout, stderr=self._stderr, stdin=subprocess.DEVNULL,
            env=dict(os.environ, **(env or {})))

    def output(self) -> str:
        with open(self.stdout_path, encoding="utf-8", errors="replace") as f:
            out = f.read()
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return out + f.read()

    def wait_for(self, pattern: str, timeout: float = 30.0, count: int = 1):
        """The first `count` matches of `pattern` in the output, once there
        are that many; fails after `timeout` seconds or when the launcher
        exits without them."""
        deadline = time.monotonic() + timeout
        while True:
            matches = list(re.finditer(pattern, self.output(), re.MULTILINE))
            if len(matches) >= count:
                return matches[:count]
            exited = self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                raise AssertionError(
                    f"{count} x {pattern!r} not in the launcher's output "
                    f"({'it exited' if exited else 'timed out'}):\n{self.output()}")
            time.sleep(0.05)

    def child_pids(self):
        """PIDs of the shards and workers the launcher reported starting."""
        out = self.output()
        return ([int(p) for p in re.findall(r"shard \d+ on \S+ \(metrics :\d+, pid (\d+)\)", out)]
                + [int(p) for p in re.findall(r"worker \d+: pid (\d+)", out)])

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the launcher did not exit within {timeout} s:\n{self.output()}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self._stdout.close()
        self._stderr.close()


def process_gone(pid: int, timeout: float = 5.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _state(pid) == "Z":  # dead, waiting for a parent that reaps it
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
