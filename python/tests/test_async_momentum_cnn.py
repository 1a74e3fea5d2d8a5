"""The example CNN with SGD + momentum 0.9 through shardtrain.torch: in async
mode (2 workers, the shards' Delayed Nesterov, the async default for
--optimizer momentum) it reaches the sync run's test accuracy within 0.01,
at the same --lr and epochs (issue 27). Before Delayed Nesterov the async
shards ran heavy-ball momentum, which diverges at the rate sync trains with.
"""

import json
import sys

import pytest

from torch_fixtures import EXAMPLE, FASHION_MNIST, LauncherRun

pytest.importorskip("torch", reason="python3-torch is not installed")


# Two epochs: after one, async runs ended 0.843-0.858 (7 runs) around a
# sync 0.8536, so one in seven missed 0.01; after two they end 0.8737-0.8761
# (4 runs) against a sync 0.8708.
WORKERS, BATCH, EXAMPLES, EPOCHS = 2, 32, 12000, 2


def final_accuracy(tmp_path, mode):
    results = tmp_path / f"{mode}.json"
    directory = tmp_path / mode
    directory.mkdir()
    # A cosine schedule over the run, so the accuracy compared is that of
    # a settled model, not of one noisy step; an async shard counts every
    # worker's pushes.
    steps = EPOCHS * (EXAMPLES // WORKERS // BATCH)
    total = steps if mode == "sync" else steps * WORKERS
    run = LauncherRun(directory, ["--shards", "2", "--workers", str(WORKERS), "--mode", mode,
                                  "--optimizer", "momentum", "--lr", "0.05",
                                  "--lr_schedule", "cosine", "--lr_total_steps", str(total),
                                  "--", sys.executable, EXAMPLE, "--epochs", str(EPOCHS),
                                  "--batch", str(BATCH), "--train-examples", str(EXAMPLES),
                                  "--data", FASHION_MNIST, "--results", str(results)])
    try:
        assert run.wait(timeout=240) == 0, run.output()
    finally:
        run.stop()
    report = json.loads(results.read_text())
    assert report["mode"] == mode
    return report["final_test_accuracy"], run.output()


def test_async_momentum_reaches_the_sync_accuracy(tmp_path):
    sync, _ = final_accuracy(tmp_path, "sync")
    async_, out = final_accuracy(tmp_path, "async")
    print(f"CNN momentum 0.9 lr 0.05, {EPOCHS} epochs: sync {sync:.4f} async {async_:.4f}")
    assert sync >= 0.80
    assert async_ == pytest.approx(sync, abs=0.01), out
