"""Async mode through shardtrain.torch: the example CNN, 2 workers, one epoch
of a 10k-example subset of Fashion-MNIST, learns (test accuracy >= 0.80),
and the chief writes ps-worker's results file."""

import json
import sys

import pytest

from torch_fixtures import EXAMPLE, FASHION_MNIST, LauncherRun

pytest.importorskip("torch", reason="python3-torch is not installed")


def test_two_async_workers_learn_fashion_mnist(tmp_path):
    results = tmp_path / "results.json"
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "2", "--mode", "async",
                                 "--optimizer", "adam", "--lr", "0.002", "--max_staleness", "4",
                                 "--", sys.executable, EXAMPLE, "--epochs", "1",
                                 "--batch", "32", "--train-examples", "10000",
                                 "--data", FASHION_MNIST, "--results", str(results)])
    try:
        assert run.wait(timeout=120) == 0, run.output()
    finally:
        run.stop()
    out = run.output()
    assert "[worker 0] epoch 1/1  loss " in out, out
    report = json.loads(results.read_text())
    assert report["mode"] == "async"
    assert report["workers"] == 2 and report["shards"] == 2
    assert report["optimizer"].startswith("adam"), report["optimizer"]
    assert report["steps_per_worker"] == 5000 // 32
    assert len(report["per_epoch"]) == 1
    assert report["samples_per_second"] > 0
    assert report["final_test_accuracy"] >= 0.80, out
