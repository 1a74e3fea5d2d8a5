"""PyTorch on shardtrain: the shards hold the parameters and run the optimizer.

DistributedOptimizer takes the place of a torch.optim optimizer (its API is
shaped like Horovod's). The update rule is the shards' (ps-server
--optimizer, --lr, ...): step() does not compute an update, it brings the
shards' updated parameters into the model.

  - On construction it connects to the shards named by the launcher's
    environment (shardtrain.env), registers every parameter by name with its
    current values (worker 0's values create the shards' copy; the others'
    are only checked for shape) and pulls the shards' parameters into the
    model, so every worker starts from the same parameters without a
    broadcast, and a restarted worker resumes where the job is.
  - backward() pushes each parameter's gradient as soon as autograd has
    accumulated it (a hook on the parameter's gradient accumulator, as
    Horovod does), and the shards answer with the parameter's next values,
    so communication overlaps the rest of backward. (In sync mode with
    SparseEmbedding tables in the model, the first parameter's push waits
    for step(), after the step's table pushes: see "the hybrid" below.)
  - step() waits for those exchanges; the pulled parameters are then in the
    model, written in place: a CPU float32 parameter's memory is handed to
    the client as a numpy view (zero copy); a CUDA parameter goes through a
    pinned host buffer and is copied back.

Consistency is exactly ps-worker's (worker/trainer.h): in sync mode step t
pushes for clock t + 1 and waits until every worker's gradient of step t has
been averaged and applied (N workers train like one process on the union of
their batches); in async mode every gradient is applied as it arrives and
the shards hold a worker that runs more than --max_staleness clocks ahead.
A sync worker the shards dropped (it stalled) rejoins at the job's step;
`clock` then jumps, so a training loop should take its position from it.

The hybrid: sync mode with async SparseEmbedding tables (PERSIA's: dense
layers in steps, rows applied as pushes come). A step's lookups see every
worker's table pushes of the steps before, as a sync table's do: a table
push is answered once applied, and the dense step it belongs to cannot end
before it, because each worker's push of its first parameter leaves only
in step(), once the table pushes its backward started have been applied.
(In async mode step() waits for those table pushes after the dense
exchange, beside which they travelled.)

Momentum under asynchrony, on the workers (DANA-Slim). Heavy-ball momentum
on an async server amplifies staleness; besides the shards' delay-tolerant
rule (an async shard's --optimizer=momentum|nesterov), worker_momentum=γ
serves models that need momentum while the shards run plain SGD (ps-server
--optimizer=sgd). Each worker keeps its own buffer
v per parameter and pushes, instead of its gradient g,

    v <- γ·v + g          (the buffer; PyTorch's convention: no lr in it)
    push  γ·v + g         (the Bengio-Nesterov step, with the new v)

so the shards' SGD applies θ <- θ - lr·(γ·v + g). This is DANA-Slim
(Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed
Asynchronous Environment", arXiv:1907.11612): one worker trains exactly like
torch.optim.SGD(momentum=γ, nesterov=True); with N async workers each
worker's momentum holds its own gradients only, which keeps the gap between
the parameters a gradient is computed on and those it is applied to near
plain async SGD's. In sync mode the shards average the N pushes, and the
mean of the N buffers is the buffer of the mean gradient, so N workers train
exactly like torch.optim.SGD(momentum=γ, nesterov=True) on the union of
their batches (as ps-server --optimizer=nesterov would). The shards must run
sgd: the constructor asks them (Status) and raises ValueError, before it
registers anything, when one runs another rule (it would add a second
momentum or an adaptive scaling on top). Leave --delay_compensation off too:
its correction is made for a gradient (the shards do not report it, so this
is not checked). The shards' --lr, --lr_schedule
and --weight_decay act on the pushed vector (so weight decay stays outside
the momentum, unlike torch.optim.SGD's). The buffers are this optimizer's
state (state_dict()["state"][i]["momentum_buffer"], made at the first step),
so a script may save and restore them with its model. A worker process
starts with zero buffers, and they are reset to zero whenever a push of
this worker was not applied: a sync worker the shards dropped (it stalled)
that rejoins at the job's step, or one whose step a previous process of the
same index had pushed already.

Differences from torch.optim: a parameter that got no gradient in a step
(unused, grad None) is pushed a zero gradient, as every worker must push
every tensor each step; momentum or Adam then still move it. The learning
rate lives on the shards: param_groups carry no "lr" and LR schedulers do
not apply (use ps-server --lr_schedule).

Misuse raises at once: a parameter that is not float32, not contiguous,
frozen (requires_grad False), sparse or on an unsupported device (at
construction); step() with no backward() since the last step; a second
backward() before step() (see backward_passes_per_step); zero_grad()
between backward() and step(), which would change gradients still being
sent.

Example (run as N copies under `shardtrain-run --workers N -- python3 ...`):

    import shardtrain.torch as st
    model = Net()
    opt = st.DistributedOptimizer(model, batch_size=64)
    sampler = DistributedSampler(data, **st.sampler_args())
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()          # gradients leave as they are computed
        opt.step(loss=loss)      # the shards' new parameters are in `model`
        opt.zero_grad()
    opt.finish(wait_for_others=st.is_chief())
    opt.close()

Thread-safety: one thread trains (calls backward, step, zero_grad); a
background thread of the optimizer sends heartbeats.
"""

import atexit
import logging
import threading
import time
import weakref
from typing import Iterable, List, Optional, Tuple, Union

import torch

import shardtrain
from shardtrain import env
from shardtrain.env import is_chief, rank, sampler_args, world_size  # noqa: F401 (re-exported)
from shardtrain.sparse_embedding import SparseEmbedding  # noqa: F401 (re-exported)

__all__ = ["DistributedOptimizer", "sampler_args", "rank", "world_size", "is_chief"]

_log = logging.getLogger("shardtrain.torch")

# Sync: pulls that may be needed for every partition to agree on the step
# (as ps-worker's trainer).
_MAX_SYNC_PULLS = 1000


class _Param:
    """One registered parameter and the host memory the client reads the
    gradient from and writes the parameters to."""

    def __init__(self, index: int, name: str, param: "torch.nn.Parameter"):
        self.index = index
        self.name = name
        self.param = param
        self.numel = param.numel()
        self.cuda = param.device.type == "cuda"
        if self.cuda:
            self.host_param = torch.empty(self.numel, dtype=torch.float32, pin_memory=True)
            self.host_param.copy_(param.detach().view(-1))
            self.host_grad = torch.empty(self.numel, dtype=torch.float32, pin_memory=True)
        else:
            # The parameter's own memory: pulls land in the model directly.
            self.host_param = param.detach().view(-1)
            self.host_grad = None
        self.param_view = self.host_param.numpy()
        self.push_buffer = None  # worker momentum: the vector pushed, γ·v + g
        self.passes = 0  # gradients accumulated since the last step
        self.started = False  # its exchange of this step is under way
        self.grad_ref = None  # the gradient being sent; alive until step()

    def grad_view(self, grad: "torch.Tensor"):
        """A float32 C-contiguous numpy view of `grad` for the client; the
        tensor behind it is kept in grad_ref until the exchange ends."""
        if grad.layout != torch.strided:
            raise RuntimeError(
                f"the gradient of parameter {self.name!r} is sparse; shardtrain sends "
                "dense gradients (use sparse=False for embeddings)")
        if grad.dtype != torch.float32:
            raise RuntimeError(
                f"the gradient of parameter {self.name!r} is {grad.dtype}, not torch.float32")
        grad = grad.detach()
        if self.cuda:
            self.host_grad.copy_(grad.reshape(-1))  # waits for the copy
            self.grad_ref = self.host_grad
        else:
            self.grad_ref = grad.contiguous().view(-1)
        return self.grad_ref.numpy()

    def land(self):
        """Makes the pulled values the model's (CUDA: copies them back)."""
        if self.cuda:
            with torch.no_grad():
                self.param.view(-1).copy_(self.host_param, non_blocking=True)


def _named_parameters(model) -> List[Tuple[str, "torch.nn.Parameter"]]:
    if isinstance(model, torch.nn.Module):
        return list(model.named_parameters())
    named = list(model)
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(
                "DistributedOptimizer takes a torch.nn.Module or (name, parameter) pairs "
                f"such as model.named_parameters(); got an element {type(item).__name__}")
    return named


def _check_parameter(name: str, p: "torch.Tensor"):
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"parameter {name!r} is a {type(p).__name__}, not a tensor")
    if p.dtype != torch.float32:
        raise TypeError(
            f"parameter {name!r} is {p.dtype}; shardtrain trains torch.float32 "
            "parameters (call model.float())")
    if not p.requires_grad:
        raise ValueError(
            f"parameter {name!r} does not require grad, so it never gets a gradient; "
            "pass only the trained ones: [(n, p) for n, p in model.named_parameters() "
            "if p.requires_grad]")
    if p.layout != torch.strided:
        raise ValueError(f"parameter {name!r} is sparse; shardtrain holds dense tensors")
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"parameter {name!r} is on {p.device}; shardtrain supports cpu and cuda")
    if not p.is_contiguous():
        raise ValueError(
            f"parameter {name!r} is not contiguous (e.g. channels_last); shardtrain "
            "reads and writes parameters as one row-major block")
    if p.numel() == 0:
        raise ValueError(f"parameter {name!r} has no elements")


class DistributedOptimizer(torch.optim.Optimizer):
    """See the module comment. Not thread-safe: one thread trains."""

    def __init__(self, model: Union["torch.nn.Module", Iterable[Tuple[str, "torch.Tensor"]]],
                 *, backward_passes_per_step: int = 1, batch_size: Optional[int] = None,
                 settings: Optional[env.Settings] = None,
                 heartbeat_interval: float = 1.0, worker_momentum: float = 0.0,
                 **client_overrides):
        """`model`: a module (all its parameters) or model.named_parameters()
        (names identify the tensors on the shards: every worker must use the
        same names). `backward_passes_per_step`: backward() calls that
        accumulate one step's gradient (scale the loss yourself).
        `batch_size`: examples per step, for the samples metrics when step()
        is not told. `settings`: the job (default: shardtrain.env.from_environ()).
        `worker_momentum`: γ in [0, 1); above 0 each push is DANA-Slim's
        γ·v + g instead of the gradient (see the module comment), and the
        shards must run --optimizer=sgd (ValueError otherwise).
        `client_overrides`: extra shardtrain.Client keyword arguments
        (e.g. rpc_timeout=10.0)."""
        named = _named_parameters(model)
        if not named:
            raise ValueError("the model has no parameters")
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step} is not >= 1")
        worker_momentum = float(worker_momentum)
        if not 0.0 <= worker_momentum < 1.0:
            raise ValueError(f"worker_momentum={worker_momentum} is not in [0, 1)")
        seen_names, seen_tensors = set(), {}
        for name, p in named:
            _check_parameter(name, p)
            if name in seen_names:
                raise ValueError(f"two parameters are named {name!r}")
            if id(p) in seen_tensors:
                raise ValueError(
                    f"parameters {seen_tensors[id(p)]!r} and {name!r} are the same tensor")
            seen_names.add(name)
            seen_tensors[id(p)] = name
        super().__init__([p for _, p in named], {})

        self.settings = settings if settings is not None else env.from_environ()
        if not self.settings.distributed:
            raise RuntimeError(
                f"{env.SERVERS} is not set: start the job with shardtrain-run, or set "
                f"{env.SERVERS}, {env.WORKER}, {env.NUM_WORKERS} and {env.MODE}")
        self.backward_passes_per_step = backward_passes_per_step
        self.batch_size = batch_size
        self.worker_momentum = worker_momentum
        self._params = [_Param(i, name, p) for i, (name, p) in enumerate(named)]
        self._any_cuda = any(p.cuda for p in self._params)
        self._sync = self.settings.sync
        self._closed = False
        self._pending = False  # some exchange of this step started
        self._held_back = None  # the parameter whose push step() starts
        self._last_loss = 0.0
        # The last step's exchange figures (finish_exchanges' dict and timings).
        self.last_step_stats = {}
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread = None

        kwargs = self.settings.client_kwargs()
        # step() starts every tensor's exchange, with a zero gradient for
        # those backward left out.
        kwargs["exchanges_cover_every_tensor"] = True
        kwargs.update(client_overrides)
        self.client = shardtrain.Client(**kwargs)
        try:
            if self.worker_momentum > 0.0:
                self._check_shards_run_sgd()
            self.client.register([(p.name, tuple(p.param.shape), p.param_view)
                                  for p in self._params])
            self._clock = self._initial_clock()
        except BaseException:
            self.client.close()
            raise
        self.first_step = self._clock  # where this process started (a resume: > 0)
        self._tables = []  # the model's SparseEmbeddings
        self._hooks = []
        self._install_hooks()
        # When this step's compute began: the model's first forward with
        # grad enabled since the last step (a module was given), else the
        # end of the last step.
        self._step_start = time.monotonic()
        self._forward_seen = False
        if isinstance(model, torch.nn.Module):
            self._hooks.append(model.register_forward_pre_hook(self._on_forward))
            # Sparse tables train through this worker's client.
            tables = [m for m in model.modules() if isinstance(m, SparseEmbedding)]
            self._tables = tables
            for module in tables:
                if not module.attached:
                    module.attach(self.client)
            if self._sync and tables:
                # A sync step ends on the shards once every worker's dense
                # push is in; a table push (sent by backward, and answered
                # once applied) may still be on its way then, and another
                # worker's next lookup would miss it. So the first
                # parameter's push (typically the last gradient backward
                # makes) waits for step(), after every table push of the
                # step is in: each step's lookups see every worker's table
                # pushes of the steps before, in the hybrid (async tables)
                # as with sync tables.
                self._held_back = self._params[0]
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeats, args=(heartbeat_interval,), daemon=True,
            name=f"shardtrain heartbeats (worker {self.settings.worker})")
        self._heartbeat_thread.start()
        # Without close(), stop the heartbeats before the interpreter tears
        # down (a daemon thread inside an RPC then must not outlive it).
        me = weakref.ref(self)
        atexit.register(lambda: me() is not None and me()._stop_heartbeats())

    # ---- where the job is ----------------------------------------------

    @property
    def clock(self) -> int:
        """Steps this worker has finished (the job's step in sync mode)."""
        return self._clock

    @property
    def metrics_port(self) -> int:
        """The worker's Prometheus port, or -1."""
        return self.client.metrics_port

    def _param_views(self):
        return [p.param_view for p in self._params]

    def _pull(self, clock: int, min_version: int):
        self.client.pull(clock, min_version, self._param_views())
        self._land_all()

    def _land_all(self):
        for p in self._params:
            p.land()
        if self._any_cuda:
            # The next exchange writes the pinned buffers again: the copies
            # out of them must be done by then.
            torch.cuda.current_stream().synchronize()

    def _initial_clock(self) -> int:
        if not self._sync:
            clock = self.client.registered_worker_clock
            self._pull(clock, 0)
            return clock
        clock = self._sync_to_shard_step()
        self._pull(clock, clock)
        # The pull may have brought a later step (the others went on).
        return self._sync_to_shard_step()

    def _sync_to_shard_step(self) -> int:
        """Sync: pulls until every partition has the same version; returns it."""
        for _ in range(_MAX_SYNC_PULLS):
            lo, hi = self.client.known_versions
            if lo == hi:
                return hi
            # Some partitions are a step ahead: wait for the rest.
            self._pull(hi, hi)
        lo, hi = self.client.known_versions
        raise RuntimeError(f"partition versions still range over [{lo}, {hi}] after "
                           f"{_MAX_SYNC_PULLS} pulls")

    def _rejoin(self, why: str, pull_first: bool):
        was = self._clock
        if pull_first:
            self._pull(self._clock, 0)
        self._clock = self._sync_to_shard_step()
        # The last push was dropped: a buffer holding its gradient would
        # push momentum the shards never applied.
        self._reset_worker_momentum()
        _log.warning("worker %d rejoined at step %d (was at %d): %s",
                     self.settings.worker, self._clock, was, why)

    def _check_shards_run_sgd(self):
        """worker_momentum: refuses shards whose update rule is not plain SGD."""
        rules = sorted({shard["optimizer"] for shard in self.client.status()})
        if rules != ["sgd"]:
            raise ValueError(
                f"worker_momentum={self.worker_momentum} (DANA-Slim) pushes momentum steps "
                f"for the shards' plain SGD, but the shards run {', '.join(rules)}, which "
                "would add its own momentum or scaling on top: start the shards with "
                "--optimizer=sgd, or push plain gradients (worker_momentum=0)")

    def _reset_worker_momentum(self):
        for p in self._params:
            self.state[p.param].pop("momentum_buffer", None)

    def _heartbeats(self, interval: float):
        failures = 0
        while not self._heartbeat_stop.wait(interval):
            try:
                self.client.heartbeat(self._clock)
                failures = 0
            except shardtrain.ShardtrainError as e:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    _log.warning("heartbeat failed (%d in a row): %s", failures, e)

    # ---- gradients -----------------------------------------------------

    def _install_hooks(self):
        for p in self._params:
            hook = self._make_hook(p)
            if hasattr(p.param, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._hooks.append(p.param.register_post_accumulate_grad_hook(
                    lambda _param, hook=hook: hook()))
            else:
                # The AccumulateGrad node of the parameter (Horovod's way);
                # its hooks run once the gradient is in p.grad.
                accumulator = p.param.expand_as(p.param).grad_fn.next_functions[0][0]
                self._hooks.append(accumulator.register_hook(lambda *_, hook=hook: hook()))
                self._hooks.append(accumulator)  # keeps the node, and the hook, alive

    def _on_forward(self, module, inputs):
        if not self._forward_seen and torch.is_grad_enabled():
            self._forward_seen = True
            self._step_start = time.monotonic()

    def _make_hook(self, p: _Param):
        def on_gradient():
            if self._closed:
                return
            p.passes += 1
            if p.passes > self.backward_passes_per_step:
                raise RuntimeError(
                    f"backward() produced the gradient of {p.name!r} {p.passes} times since "
                    f"the last step() (backward_passes_per_step={self.backward_passes_per_step}): "
                    "call step() after backward()")
            if p.passes == self.backward_passes_per_step and p is not self._held_back:
                self._start(p, p.param.grad)
        return on_gradient

    def _worker_momentum_step(self, p: _Param, grad: "torch.Tensor") -> "torch.Tensor":
        """DANA-Slim: v <- γ·v + g; returns γ·v + g (p.push_buffer)."""
        gamma = self.worker_momentum
        with torch.no_grad():
            state = self.state[p.param]
            buffer = state.get("momentum_buffer")
            if buffer is None:
                buffer = torch.zeros_like(p.param, memory_format=torch.contiguous_format)
                state["momentum_buffer"] = buffer
            buffer.mul_(gamma).add_(grad)
            if p.push_buffer is None:
                p.push_buffer = torch.empty_like(buffer)
            torch.add(grad, buffer, alpha=gamma, out=p.push_buffer)
        return p.push_buffer

    def _start(self, p: _Param, grad: "torch.Tensor"):
        next_clock = self._clock + 1
        if self.worker_momentum > 0.0:
            grad = self._worker_momentum_step(p, grad)
        view = p.grad_view(grad)
        self.client.start_exchange(p.index, next_clock, next_clock if self._sync else 0,
                                   view, p.param_view)
        p.started = True
        self._pending = True

    # ---- torch.optim.Optimizer -----------------------------------------

    def zero_grad(self, set_to_none: bool = False):
        held = self._held_back
        if self._pending or (held is not None and held.passes == self.backward_passes_per_step):
            raise RuntimeError(
                "zero_grad() between backward() and step(): the gradients are still being "
                "sent; call step() first")
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None, *, loss=None, samples: Optional[int] = None):
        """Finishes this step's exchanges: afterwards the model holds the
        shards' parameters for the next step. `closure` (optional) runs
        forward and backward and returns the loss; `loss` and `samples`
        (default batch_size) feed the worker metrics. Returns the loss."""
        self._check_open()
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._pending and all(p.passes == 0 for p in self._params):
            raise RuntimeError(
                "step() without backward(): no gradient was computed since the last step()")
        compute_end = time.monotonic()
        if self._sync:
            # The held-back push leaves after the step's table pushes are in.
            self._flush_tables()
        for p in self._params:
            if not p.started:
                # No gradient this step (or fewer passes than asked): the
                # shards need one from every worker for every tensor.
                grad = p.param.grad
                self._start(p, grad if grad is not None else torch.zeros_like(p.param))
        try:
            stats = self._finish_exchanges()
            # Async: the table pushes travelled beside the dense exchange.
            self._flush_tables()
        finally:
            for p in self._params:
                p.passes = 0
                p.started = False
                p.grad_ref = None
            self._pending = False
        if loss is not None:
            self._last_loss = float(loss)
        now = time.monotonic()
        exchange = now - compute_end
        wait = min(stats.get("server_wait_seconds", 0.0), exchange)
        if samples is None:
            samples = self.batch_size or 0
        self.client.record_step(compute_end - self._step_start, 0.0, exchange - wait, wait,
                                now - self._step_start, samples, self._last_loss,
                                stats.get("max_staleness", 0))
        self.last_step_stats = dict(stats, compute_seconds=compute_end - self._step_start,
                                    exchange_seconds=exchange, wait_seconds=wait)
        self._step_start = now
        self._forward_seen = False
        return loss

    def _flush_tables(self):
        """Waits for the table pushes backward started (SparseEmbedding.flush)."""
        for table in self._tables:
            table.flush()

    def _finish_exchanges(self) -> dict:
        step = self._clock
        try:
            stats = self.client.finish_exchanges()
        except shardtrain.ShardtrainError as e:
            if self._sync and e.code == "FAILED_PRECONDITION":
                # A late gradient: the shards went on without this worker.
                self._rejoin(str(e), pull_first=True)
                return {}
            if self._sync and e.code == "ALREADY_EXISTS":
                # This worker index (a previous process) pushed this step
                # already: the step goes on with that gradient.
                _log.info("%s; continuing with it", e)
                self._reset_worker_momentum()  # this process's push was not applied
                self._pull(step + 1, step + 1)
                stats = {}
            else:
                raise
        self._land_all()
        if self._sync:
            lo, hi = self.client.known_versions
            if lo < step + 1:
                raise RuntimeError(f"sync step {step} received parameters of versions "
                                   f"[{lo}, {hi}]")
            if hi > step + 1:
                self._rejoin(f"sync step {step} received parameters of versions [{lo}, {hi}]: "
                             "the shards went on without this worker", pull_first=False)
                return stats
        self._clock = step + 1
        return stats

    # ---- the end of training -------------------------------------------

    def pull(self):
        """Pulls the shards' current parameters into the model (e.g. before
        evaluating in async mode). Not between backward() and step()."""
        self._check_open()
        if self._pending:
            raise RuntimeError("pull() between backward() and step()")
        self._pull(self._clock, 0)

    def cluster_steps(self) -> int:
        """Steps all workers together have finished, as the shards see it."""
        response = self.client.heartbeat(self._clock)
        return sum(int(w["clock"]) for w in response["workers"])

    def finish(self, wait_for_others: bool = False, timeout: float = 600.0):
        """Tells the shards this worker is done. With wait_for_others (the
        chief, before its final evaluation), waits up to `timeout` seconds
        until every worker is done or gone, then pulls the final parameters
        into the model."""
        self._check_open()
        if self._pending:
            raise RuntimeError("finish() between backward() and step()")
        self._stop_heartbeats()
        give_up = time.monotonic() + timeout
        while True:
            response = self.client.heartbeat(self._clock, done=True)
            if not wait_for_others:
                return
            workers = response["workers"]
            finished = sum(1 for w in workers if w["done"] or not w["live"])
            if finished >= self.settings.num_workers:
                break
            if time.monotonic() > give_up:
                raise TimeoutError(f"{finished} of {self.settings.num_workers} workers "
                                   f"finished within {timeout:.0f} s")
            time.sleep(0.1)
        self._pull(self._clock, 0)

    def record_epoch(self, epoch: int, test_accuracy: float, samples_per_second: float):
        """Sets the epoch, test accuracy and throughput gauges (as ps-worker)."""
        self.client.record_epoch(epoch, test_accuracy, samples_per_second)

    def _stop_heartbeats(self):
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join()

    def _check_open(self):
        if self._closed:
            raise RuntimeError("the DistributedOptimizer is closed")

    def close(self):
        """Stops heartbeats, waits for exchanges in flight and disconnects.
        The model keeps its parameters. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_heartbeats()
        try:
            self._flush_tables()
            if self._pending:
                self.client.finish_exchanges()
        except shardtrain.ShardtrainError as e:
            _log.warning("exchanges failed at close: %s", e)
        finally:
            self._pending = False
            for hook in self._hooks:
                if hasattr(hook, "remove"):
                    hook.remove()
            self._hooks = []
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __getstate__(self):
        raise TypeError("a DistributedOptimizer holds connections and cannot be pickled")
