"""examples/torch_gpt.py through shardtrain-run: the character-level GPT
(0.81 M parameters) learns from a 300k-character slice of Vim's help files
with 2 async workers on 2 shards running Adam with the Noam schedule, and
the chief writes its results file."""

import glob
import json
import os
import sys

import pytest

from torch_fixtures import REPO, LauncherRun

pytest.importorskip("torch", reason="python3-torch is not installed")

EXAMPLE = os.path.join(REPO, "examples", "torch_gpt.py")
# vim-runtime's help (vim90 on Debian 12), as the example's default.
VIM_DOC = (sorted(glob.glob("/usr/share/vim/vim[0-9]*/doc")) or ["/usr/share/vim/vim90/doc"])[-1]
ITERS = 200

# Measured on the 2-core VM with this command (2 async workers x 200
# iterations of 8 windows, Adam at 0.0015, Noam with 50 warmup steps):
# final val loss 2.86, 2.91 and 2.83 in three runs, 37-44 s each. The
# loss starts at ln(98) = 4.58, and 3.44 is the characters' unigram entropy
# (what a model that ignores the context reaches): 3.05 is only met by a
# model that uses its context. (Async Adam at the sync lr, 0.003, with 2
# workers makes twice the sync job's Adam steps and reached only 3.17.)
MAX_VAL_LOSS = 3.05


@pytest.mark.skipif(not glob.glob(os.path.join(VIM_DOC, "*.txt")),
                    reason=f"no {VIM_DOC}/*.txt (Debian's vim-runtime is not installed)")
def test_gpt_trains(tmp_path):
    results = tmp_path / "results.json"
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", "2", "--mode", "async",
                                 "--max_staleness", "4", "--optimizer", "adam", "--lr", "0.0015",
                                 "--lr_schedule", "noam", "--warmup_steps", "50",
                                 "--", sys.executable, EXAMPLE, "--iters", str(ITERS),
                                 "--batch", "8", "--max-chars", "300000",
                                 "--eval-interval", "100", "--eval-windows", "128",
                                 "--data", VIM_DOC, "--results", str(results)])
    try:
        assert run.wait(timeout=150) == 0, run.output()
    finally:
        run.stop()
    out = run.output()
    assert f"[worker 0] iter {ITERS}/{ITERS}  train_loss " in out, out
    report = json.loads(results.read_text())
    assert report["mode"] == "async"
    assert report["workers"] == 2 and report["shards"] == 2
    assert report["optimizer"].startswith("adam"), report["optimizer"]
    assert report["steps_per_worker"] == ITERS
    assert report["train_characters"] == 300000
    assert [e["iter"] for e in report["per_interval"]] == [100, 200]
    assert report["tokens_per_second"] > 0
    first, last = report["per_interval"][0]["val_loss"], report["final_val_loss"]
    assert last < first, out
    assert last <= MAX_VAL_LOSS, out
