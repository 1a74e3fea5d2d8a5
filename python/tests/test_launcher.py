"""shardtrain-run: environment, output, exit codes, and that every process
it starts is gone after it exits, whether the job succeeds, a worker fails,
a shard dies or the launcher is interrupted."""

import json
import os
import re
import signal
import sys
import textwrap

import pytest

from torch_fixtures import BUILD_DIR, LauncherRun, process_gone

# A worker: prints its environment, says it is ready, then does what argv
# says: "exit W CODE" (worker W exits CODE, the others sleep), "sleep".
WORKER = textwrap.dedent("""
    import json, os, sys, time
    env = {k: v for k, v in os.environ.items()
           if k.startswith("SHARDTRAIN_") or k == "PYTHONPATH"}
    print("env", json.dumps(env), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    print("ready", flush=True)
    if sys.argv[1] == "exit":
        if os.environ["SHARDTRAIN_WORKER"] == sys.argv[2]:
            sys.exit(int(sys.argv[3]))
        time.sleep(120)
    elif sys.argv[1] == "sleep":
        time.sleep(120)
""")


@pytest.fixture
def worker_script(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def assert_all_gone(run, expected):
    pids = run.child_pids()
    assert len(pids) == expected, run.output()
    left = [pid for pid in pids if not process_gone(pid)]
    assert not left, f"processes left behind: {left}\n{run.output()}"


def test_runs_workers_with_the_job_environment(tmp_path, worker_script):
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "3", "--mode", "sync", "--",
                                 sys.executable, worker_script, "done"])
    try:
        assert run.wait(timeout=60) == 0, run.output()
    finally:
        run.stop()
    out = run.output()
    servers = re.findall(r"shard \d+ on (127\.0\.0\.1:\d+)", out)
    assert len(servers) == 2, out
    for w in range(3):
        line = re.search(rf"^\[worker {w}\] env (.*)$", out, re.MULTILINE)
        assert line, out
        env = json.loads(line.group(1))
        assert env["SHARDTRAIN_SERVERS"] == ",".join(servers)
        assert env["SHARDTRAIN_WORKER"] == str(w)
        assert env["SHARDTRAIN_NUM_WORKERS"] == "3"
        assert env["SHARDTRAIN_MODE"] == "sync"
        assert env["PYTHONPATH"].split(os.pathsep)[0] == os.path.join(BUILD_DIR, "python")
        assert f"[worker {w}] to stderr" in out
    # ps-server got the default optimizer and reported serving.
    assert "--optimizer=adam --lr=0.001" in out
    assert re.search(r"^\[shard 1\] .*serving on port", out, re.MULTILINE), out
    assert_all_gone(run, expected=5)


def test_exits_with_the_failing_workers_code_and_stops_the_rest(tmp_path, worker_script):
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "2", "--",
                                 sys.executable, worker_script, "exit", "1", "3"])
    try:
        code = run.wait(timeout=60)
    finally:
        run.stop()
    assert code == 3, run.output()
    assert "worker 1 failed (exit status 3)" in run.output()
    # Worker 0 was sleeping for 120 s: the launcher stopped it.
    assert_all_gone(run, expected=4)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_everything(tmp_path, worker_script, signum):
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "2", "--",
                                 sys.executable, worker_script, "sleep"])
    try:
        run.wait_for(r"^\[worker \d\] ready$", timeout=60, count=2)
        run.process.send_signal(signum)
        code = run.wait(timeout=30)
    finally:
        run.stop()
    assert code == 128 + signum, run.output()
    assert f"{signal.Signals(signum).name}: stopping the job" in run.output()
    assert_all_gone(run, expected=4)


def test_a_dead_shard_ends_the_job(tmp_path, worker_script):
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "1", "--",
                                 sys.executable, worker_script, "sleep"])
    try:
        run.wait_for(r"^\[worker 0\] ready$", timeout=60)
        shard1 = int(run.wait_for(r"shard 1 on \S+ \(metrics :\d+, pid (\d+)\)")[0].group(1))
        os.kill(shard1, signal.SIGKILL)
        code = run.wait(timeout=30)
    finally:
        run.stop()
    assert code == 1, run.output()
    assert "shard 1 died (killed by SIGKILL); stopping the job" in run.output()
    assert_all_gone(run, expected=3)


def test_a_shard_that_cannot_start_is_reported(tmp_path, worker_script):
    run = LauncherRun(tmp_path, ["--shards", "1", "--workers", "1", "--optimizer", "nonsense",
                                 "--", sys.executable, worker_script, "done"])
    try:
        code = run.wait(timeout=30)
    finally:
        run.stop()
    assert code == 1, run.output()
    assert "shard 0 did not start (exit status" in run.output()
    assert "[worker 0]" not in run.output()


@pytest.mark.parametrize("args, message", [
    (["--workers", "2"], "no command"),
    (["--workers", "0", "--", "true"], "--workers must be a positive integer"),
    (["--mode", "eventual", "--", "true"], "--mode must be sync or async"),
    (["--num_workers=3", "--", "true"], "the launcher sets --num_workers itself"),
    (["--replicas", "4", "--shards", "4", "--", "true"], "--replicas must be 1, 2 or 3"),
    (["--shards", "2", "--replicas", "3", "--", "true"],
     "--replicas 3 needs at least 3 shards, not 2"),
    (["--etcd_endpoints=127.0.0.1:2379", "--", "true"],
     "the launcher sets --etcd_endpoints itself"),
])
def test_usage_errors(tmp_path, args, message):
    run = LauncherRun(tmp_path, args)
    try:
        assert run.wait(timeout=30) == 2
    finally:
        run.stop()
    assert message in run.output()


# The workers' interpreter. The extension's is the build's Python3_EXECUTABLE.
def built_for() -> str:
    with open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("Python3_EXECUTABLE:"):
                return line.split("=", 1)[1].strip()
    raise AssertionError(f"no Python3_EXECUTABLE in {BUILD_DIR}/CMakeCache.txt")


@pytest.fixture
def bare_python(tmp_path):
    """A python3 without site packages (no torch, no numpy): a virtual
    environment of the extension's interpreter, made by hand (no venv
    module needed)."""
    real = os.path.realpath(built_for())
    bin_dir = tmp_path / "bare" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(real)
    (tmp_path / "bare" / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n")
    return str(bin_dir / "python3")


TORCH_WORKER = textwrap.dedent("""
    import sys
    import torch
    import shardtrain
    print("interpreter", sys.executable, flush=True)
""")


def test_a_script_path_runs_with_the_extensions_interpreter(tmp_path, bare_python):
    script = tmp_path / "torch_worker.py"
    script.write_text("#!/usr/bin/env python3\n" + TORCH_WORKER)
    # `python3` on PATH is the bare one: the launcher must not take it.
    path = os.path.dirname(bare_python) + os.pathsep + os.environ.get("PATH", "")
    run = LauncherRun(tmp_path, ["--workers", "2", "--", str(script)], env={"PATH": path})
    try:
        assert run.wait(timeout=60) == 0, run.output()
    finally:
        run.stop()
    lines = re.findall(r"^\[worker \d\] interpreter (\S+)$", run.output(), re.MULTILINE)
    assert lines == [built_for()] * 2, run.output()


def test_an_interpreter_without_torch_fails_before_any_shard_starts(tmp_path, bare_python):
    script = tmp_path / "torch_worker.py"
    script.write_text(TORCH_WORKER)
    run = LauncherRun(tmp_path, ["--workers", "2", "--shards", "2", "--",
                                 bare_python, str(script), "--flag"])
    try:
        code = run.wait(timeout=60)
    finally:
        run.stop()
    out = run.output()
    assert code == 2, out
    assert "shard 0 on" not in out and "[worker" not in out, out
    assert f"the workers' Python {bare_python}" in out, out
    assert "cannot import torch:" in out, out
    assert f"was built for {built_for()}" in out, out
    # The command to use: the same, with the extension's interpreter.
    assert re.search(rf"--workers 2 --shards 2 -- {re.escape(built_for())} "
                     rf"{re.escape(str(script))} --flag$", out, re.MULTILINE), out


def test_a_build_without_the_extension_says_how_to_build_it(tmp_path, worker_script):
    # A build tree whose package lacks _core: the launcher names the target.
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "ps-server").symlink_to(os.path.join(BUILD_DIR, "bin", "ps-server"))
    package = build / "python" / "shardtrain"
    package.mkdir(parents=True)
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "shardtrain")
    for name in ("__init__.py", "env.py"):
        (package / name).write_text(open(os.path.join(source, name)).read())
    (build / "CMakeCache.txt").write_text(f"Python3_EXECUTABLE:FILEPATH={sys.executable}\n")
    run = LauncherRun(tmp_path, ["--build-dir", str(build), "--",
                                 sys.executable, worker_script, "done"],
                      env={"PYTHONPATH": ""})
    try:
        code = run.wait(timeout=60)
    finally:
        run.stop()
    out = run.output()
    assert code == 2, out
    assert "cannot import shardtrain:" in out, out
    assert f"the extension is not built: cmake --build {build} --target _core" in out, out
    assert "shard 0 on" not in out, out


def test_commands_that_are_not_python_are_not_checked(tmp_path):
    run = LauncherRun(tmp_path, ["--", "sh", "-c", "echo not python"])
    try:
        assert run.wait(timeout=60) == 0, run.output()
    finally:
        run.stop()
    assert "[worker 0] not python" in run.output()
