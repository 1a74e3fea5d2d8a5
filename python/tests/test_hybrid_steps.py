"""The hybrid (sync mode, an async SparseEmbedding table) through
shardtrain.torch: each step's lookups see every worker's table pushes of
the steps before, even when a worker's table push leaves well after its
dense pushes (worker 1's backward stalls between the two here) and takes
long to arrive (worker 1's table pushes land 0.4 s after backward started
them: step() must wait for them before its held-back dense push)."""

import json
import sys
import textwrap

import pytest

from torch_fixtures import LauncherRun

pytest.importorskip("torch", reason="python3-torch is not installed")

STEPS = 6
WORKERS = 2

# One id in a dim-1 table with SGD at lr 1 and zero rows: every worker's
# push of a step subtracts exactly 1, so at step t the row is -2t if the
# lookup saw both workers' pushes of steps 0..t-1 (-2t - 1 if the other
# worker's of step t too). The dense layer is built
# after the lookup, so backward gets to its gradient first (as a DLRM's
# bottom MLP): its push would leave before the table's.
WORKER = textwrap.dedent(f"""
    import json
    import sys
    import threading
    import time

    import torch
    from torch import nn
    import shardtrain.torch as st

    class StallOnWorker1(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if st.rank() == 1:
                time.sleep(0.4)
            return grad

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(1, 1)
            self.emb = st.SparseEmbedding("hybrid", 1, mode="sum", optimizer="sgd",
                                          learning_rate=1.0, init="zeros")

        def forward(self, ids, x):
            e = self.emb(ids)
            self.row = float(e.detach().item())  # the lookup's row
            return StallOnWorker1.apply(e).sum() + self.dense(x).sum()

    class SlowTablePushes:
        # The client, but a started table push lands 0.4 s later.
        def __init__(self, client):
            self._client = client

        def __getattr__(self, name):
            return getattr(self._client, name)

        def push_sparse_async(self, *args):
            def land():
                time.sleep(0.4)
                self._client.push_sparse(*args)
            thread = threading.Thread(target=land)
            thread.start()
            return Landing(thread)

    class Landing:
        def __init__(self, thread):
            self._thread = thread

        def wait(self):
            self._thread.join()
            return {{}}

    model = Model()
    opt = st.DistributedOptimizer(model, batch_size=1)
    if st.rank() == 1:
        model.emb._client = SlowTablePushes(model.emb._client)
    ids = torch.tensor([[7]], dtype=torch.int64)
    x = torch.ones(1, 1)
    seen = []
    for step in range({STEPS}):
        assert opt.clock == step, (opt.clock, step)
        loss = model(ids, x)
        seen.append(model.row)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
    opt.finish()
    opt.close()
    with open(sys.argv[1] + f"/worker{{st.rank()}}.json", "w") as f:
        json.dump(seen, f)
""")


def test_hybrid_lookups_see_every_workers_table_pushes_of_the_step_before(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "seen"
    out.mkdir()
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", str(WORKERS), "--mode", "sync",
                                 "--optimizer", "sgd", "--lr", "0.1",
                                 "--", sys.executable, str(script), str(out)])
    try:
        assert run.wait(timeout=120) == 0, run.output()
    finally:
        run.stop()
    for w in range(WORKERS):
        seen = json.loads((out / f"worker{w}.json").read_text())
        # Every push of the steps before, and perhaps the other worker's of
        # this step (an async table applies it on arrival).
        want = [(-2.0 * step - 1, -2.0 * step) for step in range(STEPS)]
        assert all(lo <= row <= hi for row, (lo, hi) in zip(seen, want)), (
            f"worker {w} read {seen}, not within {want}\n{run.output()}")
