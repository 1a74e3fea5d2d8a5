"""examples/torch_ctr.py through shardtrain-run: the DLRM-style model with
its embeddings in a sparse table learns the synthetic Criteo-shaped stream
with 2 workers on 2 shards, async, sync with an async table (PERSIA's
hybrid: dense layers in synchronous steps, the embeddings as pushes come)
and sync throughout (the table applying each step's mean), and the chief
writes its results file; with --replicas 2 a shard SIGKILLed mid-run does
not stop it."""

import json
import os
import signal
import sys

import pytest

from torch_fixtures import REPO, LauncherRun

pytest.importorskip("torch", reason="python3-torch is not installed")

EXAMPLE = os.path.join(REPO, "examples", "torch_ctr.py")
# Measured on the 2-core VM with this command (2 workers x 3 epochs of
# 20,000 samples, batch 512; teacher AUC 0.875), test AUC after epoch 3:
# async 0.704 and 0.727, the hybrid (sync, async table) 0.698-0.720 in five
# runs, sync throughout 0.711 (every run), the replicated run with a shard
# kill 0.727 and 0.731; about 12 s each. After 2 epochs training is still at
# its most erratic: the hybrid ended at 0.666-0.685 in ten runs here, and at
# 0.659 once in CI. A model that learnt nothing scores 0.5; after one epoch
# these score 0.643-0.656.
EPOCHS = 3
MIN_AUC = 0.675


@pytest.mark.parametrize("mode,table_mode",
                         [("async", "async"), ("sync", "async"), ("sync", "sync")])
def test_ctr_trains(tmp_path, mode, table_mode):
    results = tmp_path / "results.json"
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "2", "--mode", mode, "--",
                                 sys.executable, EXAMPLE, "--epochs", str(EPOCHS),
                                 "--samples", "20000", "--test", "10000",
                                 "--table_mode", table_mode,
                                 "--results", str(results)])
    try:
        assert run.wait(timeout=150) == 0, run.output()
    finally:
        run.stop()
    out = run.output()
    assert f"[worker 0] epoch {EPOCHS}: loss " in out, out
    report = json.loads(results.read_text())
    epochs = report["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))
    assert f"{table_mode} table" in report["where"], report["where"]
    assert 0.8 < report["teacher_auc"] < 0.95
    assert epochs[-1]["auc"] >= MIN_AUC, out
    assert epochs[-1]["auc"] <= report["teacher_auc"] + 0.01, out
    assert epochs[-1]["loss"] < epochs[0]["loss"], out
    # Rows are created as ids arrive: the table grows, all on the shards.
    assert 0 < epochs[0]["rows_stored"] < epochs[-1]["rows_stored"], out
    assert epochs[-1]["samples_per_second"] > 0


def test_ctr_trains_through_a_shard_kill_with_replicas(tmp_path):
    """--replicas 2 on 3 shards: the launcher starts an etcd for the chains,
    and shard 1, SIGKILLed after the first epoch, does not stop the job: its
    chains go on without it (the table's rows and the dense layers alike),
    and the model reaches the bar."""
    results = tmp_path / "results.json"
    run = LauncherRun(tmp_path, ["--shards", "3", "--replicas", "2", "--workers", "2", "--",
                                 sys.executable, EXAMPLE, "--epochs", str(EPOCHS),
                                 "--samples", "20000", "--test", "10000",
                                 "--results", str(results)])
    try:
        run.wait_for(r"etcd on 127\.0\.0\.1:\d+ \(pid \d+\)", timeout=60)
        [shard] = run.wait_for(r"shard 1 on \S+ \(metrics :\d+, pid (\d+)\)", timeout=60)
        run.wait_for(r"\[worker 0\] epoch 1: loss ", timeout=150)
        os.kill(int(shard.group(1)), signal.SIGKILL)
        assert run.wait(timeout=240) == 0, run.output()
    finally:
        run.stop()
    out = run.output()
    assert "in chains of 2" in out, out
    assert ("shard 1 died (killed by SIGKILL); with --replicas 2 its chains go on without it"
            in out), out
    report = json.loads(results.read_text())
    epochs = report["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))
    assert epochs[-1]["auc"] >= MIN_AUC, out
    assert epochs[-1]["loss"] < epochs[0]["loss"], out
    # Rows counted once per replica group, whichever member answers.
    assert 0 < epochs[0]["rows_stored"] < epochs[-1]["rows_stored"], out
