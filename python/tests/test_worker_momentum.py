"""DistributedOptimizer(worker_momentum=γ): DANA-Slim on the workers over the
shards' plain SGD. Each push is γ·v + g with v <- γ·v + g (checked push by
push against a reference computed here); one worker then trains exactly like
torch.optim.SGD(momentum=γ, nesterov=True), and 2 sync workers like it on
the union of their batches; shards that do not run sgd are refused before
anything is registered."""

import os
import sys
import textwrap

import numpy as np
import pytest

import shardtrain
from shardtrain import env
from torch_fixtures import LauncherRun

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import shardtrain.torch as st  # noqa: E402 (after the skip)

GAMMA = 0.9
LR = 0.05
STEPS = 6


class Net(torch.nn.Module):
    """Two layers and a parameter forward never uses (pushed γ·v + 0)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.hidden = torch.nn.Linear(6, 8)
        self.out = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def batches():
    gen = torch.Generator().manual_seed(11)
    return [(torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen))
            for _ in range(STEPS)]


class RecordingClient:
    """The optimizer's client, with a copy of every gradient it pushes."""

    def __init__(self, client):
        self._client = client
        self.pushed = []  # per start_exchange: (tensor index, pushed values)

    def start_exchange(self, index, clock, min_version, grad, params):
        self.pushed.append((index, np.array(grad, copy=True)))
        return self._client.start_exchange(index, clock, min_version, grad, params)

    def __getattr__(self, name):
        return getattr(self._client, name)


def nesterov_reference():
    """torch.optim.SGD(momentum=γ, nesterov=True) on the same batches; a
    parameter without a gradient gets a zero one, as the shards do."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=GAMMA, nesterov=True)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_each_push_is_dana_slim_and_one_worker_is_nesterov_sgd(start_shards, mode):
    cluster = start_shards(2, [f"--mode={mode}", "--optimizer=sgd", f"--lr={LR}"], num_workers=1)
    settings = env.Settings(servers=tuple(cluster.addresses), worker=0, num_workers=1, mode=mode)
    model = Net()
    names = [n for n, _ in model.named_parameters()]
    with st.DistributedOptimizer(model, settings=settings, worker_momentum=GAMMA) as opt:
        recorder = RecordingClient(opt.client)
        opt.client = recorder
        velocity = {n: np.zeros(p.numel(), np.float32) for n, p in model.named_parameters()}
        for step, (x, y) in enumerate(batches()):
            recorder.pushed.clear()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss=loss)
            grads = {n: (p.grad.detach().numpy().reshape(-1).copy() if p.grad is not None
                         else np.zeros(p.numel(), np.float32))
                     for n, p in model.named_parameters()}
            opt.zero_grad()
            assert sorted(i for i, _ in recorder.pushed) == list(range(len(names)))
            for index, pushed in recorder.pushed:
                name = names[index]
                velocity[name] = GAMMA * velocity[name] + grads[name]
                want = GAMMA * velocity[name] + grads[name]
                np.testing.assert_allclose(pushed, want, rtol=1e-5, atol=1e-7,
                                           err_msg=f"step {step} {name}")
            # The buffer is the optimizer's state, as torch.optim.SGD's.
            state = opt.state_dict()["state"]
            np.testing.assert_allclose(state[names.index("out.weight")]["momentum_buffer"]
                                       .numpy().reshape(-1), velocity["out.weight"],
                                       rtol=1e-5, atol=1e-7)
        assert opt.clock == STEPS
        want = nesterov_reference()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")
        if mode == "sync":
            # A rejoin (its last push dropped) starts the buffers from zero.
            opt._rejoin("test", pull_first=True)
            assert all("momentum_buffer" not in s for s in opt.state.values())


def test_shards_that_do_not_run_sgd_are_refused_before_registering(start_shards):
    cluster = start_shards(1, ["--mode=async", "--optimizer=adam", "--lr=0.001"])
    settings = env.Settings(servers=tuple(cluster.addresses), worker=0, num_workers=1,
                            mode="async")
    with pytest.raises(ValueError, match=r"--optimizer=sgd.*worker_momentum=0"):
        st.DistributedOptimizer(Net(), settings=settings, worker_momentum=GAMMA)
    client = shardtrain.Client(list(cluster.addresses), 0, 1)
    try:
        assert int(client.status()[0]["num_tensors"]) == 0
    finally:
        client.close()


@pytest.mark.parametrize("gamma", [-0.1, 1.0, float("nan")])
def test_worker_momentum_out_of_range_is_refused(gamma):
    settings = env.Settings(servers=("127.0.0.1:1",), mode="async")
    with pytest.raises(ValueError, match="worker_momentum"):
        st.DistributedOptimizer(Net(), settings=settings, worker_momentum=gamma)


WORKERS = 2
BATCH = 8
WORKER = textwrap.dedent(f"""
    import sys
    import numpy as np
    import torch
    import torch.nn.functional as F
    import shardtrain.torch as st

    torch.manual_seed(100 + st.rank())  # worker 0's initial values win
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    opt = st.DistributedOptimizer(model, batch_size={BATCH}, worker_momentum={GAMMA})
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal(({STEPS}, {WORKERS}, {BATCH}, 12)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 5, size=({STEPS}, {WORKERS}, {BATCH})))
    for step in range({STEPS}):
        loss = F.cross_entropy(model(x[step, st.rank()]), y[step, st.rank()])
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
    opt.finish()
    opt.close()
    np.savez(sys.argv[1] + f"/worker{{st.rank()}}.npz",
             **{{n: p.detach().numpy() for n, p in model.named_parameters()}})
""")


def test_two_sync_workers_equal_nesterov_sgd_on_the_union(tmp_path):
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
    torch.manual_seed(100)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((STEPS, WORKERS, BATCH, 12)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 5, size=(STEPS, WORKERS, BATCH)))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=GAMMA, nesterov=True)
    for step in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[step].reshape(WORKERS * BATCH, 12)),
                                          y[step].reshape(WORKERS * BATCH)).backward()
        opt.step()
    for w in range(WORKERS):
        got = np.load(os.path.join(out, f"worker{w}.npz"))
        for name, p in model.named_parameters():
            diff = np.max(np.abs(got[name] - p.detach().numpy()))
            assert diff <= 1e-5, f"worker {w} {name}: max abs diff {diff}\n{run.output()}"
    assert max(float((initial[n] - p.detach()).abs().max())
               for n, p in model.named_parameters()) > 1e-2
