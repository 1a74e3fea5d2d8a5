"""Sync mode through shardtrain.torch: 2 workers with the shards' plain SGD
end with the parameters of one torch process that steps torch.optim.SGD on
the union of their batches (the shards average one gradient per worker, and
every worker starts from worker 0's initial values)."""

import os
import sys
import textwrap

import numpy as np
import pytest

from torch_fixtures import LauncherRun

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

STEPS = 20
BATCH = 8  # per worker
LR = 0.1
WORKERS = 2

# The model and data both sides build; data[step][worker] is that worker's
# batch of that step.
COMMON = textwrap.dedent(f"""
    import numpy as np
    import torch
    from torch import nn

    def make_model(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 5))

    def batches():
        rng = np.random.default_rng(7)
        x = rng.standard_normal(({STEPS}, {WORKERS}, {BATCH}, 12)).astype(np.float32)
        y = rng.integers(0, 5, size=({STEPS}, {WORKERS}, {BATCH}))
        return torch.from_numpy(x), torch.from_numpy(y)
""")

WORKER = COMMON + textwrap.dedent(f"""
    import sys
    import torch.nn.functional as F
    import shardtrain.torch as st

    # Each worker initialises differently: worker 0's values must win.
    model = make_model(seed=100 + st.rank())
    opt = st.DistributedOptimizer(model, batch_size={BATCH})
    x, y = batches()
    for step in range({STEPS}):
        assert opt.clock == step, (opt.clock, step)
        loss = F.cross_entropy(model(x[step, st.rank()]), y[step, st.rank()])
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
    opt.finish()
    opt.close()
    np.savez(sys.argv[1] + f"/worker{{st.rank()}}.npz",
             **{{n: p.detach().numpy() for n, p in model.named_parameters()}})
""")


def reference_parameters():
    namespace = {}
    exec(COMMON, namespace)
    model = namespace["make_model"](seed=100)  # worker 0's initial values
    x, y = namespace["batches"]()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        union_x = x[step].reshape(WORKERS * BATCH, -1)
        union_y = y[step].reshape(WORKERS * BATCH)
        loss = torch.nn.functional.cross_entropy(model(union_x), union_y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


def test_two_sync_workers_equal_one_process_on_the_union(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "params"
    out.mkdir()
    run = LauncherRun(tmp_path, ["--shards", "2", "--workers", str(WORKERS), "--mode", "sync",
                                 "--optimizer", "sgd", "--lr", str(LR),
                                 "--", sys.executable, str(script), str(out)])
    try:
        assert run.wait(timeout=120) == 0, run.output()
    finally:
        run.stop()
    expected = reference_parameters()
    for w in range(WORKERS):
        got = np.load(os.path.join(out, f"worker{w}.npz"))
        assert sorted(got.files) == sorted(expected), got.files
        for name, want in expected.items():
            diff = np.max(np.abs(got[name] - want))
            assert diff <= 1e-5, f"worker {w} {name}: max abs diff {diff}\n{run.output()}"
    # The run moved the parameters: equality is not the initial values'.
    namespace = {}
    exec(COMMON, namespace)
    initial = {n: p.detach().numpy() for n, p in namespace["make_model"](100).named_parameters()}
    assert max(np.max(np.abs(initial[n] - expected[n])) for n in expected) > 1e-2
