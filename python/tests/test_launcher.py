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
])
def test_usage_errors(tmp_path, args, message):
    run = LauncherRun(tmp_path, args)
    try:
        assert run.wait(timeout=30) == 2
    finally:
        run.stop()
    assert message in run.output()
