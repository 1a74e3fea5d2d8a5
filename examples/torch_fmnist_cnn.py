#!/usr/bin/env python3
"""A small CNN trained on Fashion-MNIST with PyTorch, on shardtrain or alone.

On shardtrain (N workers, each training on its own share of the data; the
shards hold the parameters and run the optimizer):

  scripts/shardtrain-run --workers 2 --shards 2 --mode sync -- \\
      /usr/bin/python3 examples/torch_fmnist_cnn.py
  scripts/shardtrain-run --workers 2 --shards 2 --mode async -- \\
      /usr/bin/python3 examples/torch_fmnist_cnn.py

As one plain PyTorch process (the same model, data order and optimizer
arithmetic; for comparison), with --local or whenever SHARDTRAIN_SERVERS is
unset:

  /usr/bin/python3 examples/torch_fmnist_cnn.py --local [--batch 128]

The optimizer. On shardtrain it is the shards' (ps-server flags given to
shardtrain-run); its defaults, --optimizer=adam --lr=0.001, are what this
example is tuned for (>= 0.91 test accuracy in sync mode and >= 0.90 in
async mode with 2 workers and its default 10 epochs of batch 64 per worker).
Pass other flags to the launcher before "--", e.g. `--optimizer momentum
--lr 0.05`, and give the same --optimizer/--lr here with --local for the
comparison. Sync N workers with --batch B train like one process with batch
N * B.

The chief (worker 0) evaluates at every epoch end and prints a line like
ps-worker's; --results FILE writes ps-worker's results JSON. The data comes
from --data (default /usr/share/datasets/fashion-mnist, the IDX gzip files
of Debian's dataset-fashion-mnist), read with gzip and numpy; nothing is
downloaded.
"""

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
# Mean and standard deviation of the training images' pixels (in [0, 1]).
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530
MODEL = "cnn:c32-c64-fc10"


class Net(nn.Module):
    """conv 3x3 (32) - pool - conv 3x3 (64) - pool - fc 10: 50k parameters."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def read_idx(path: str, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load_split(data: str, prefix: str):
    """(images N x 1 x 28 x 28 float32, normalised; labels N int64)."""
    images = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"), 8)
    images = images.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{data}: {images.shape[0]} {prefix} images but {labels.shape[0]} labels")
    images = (images - PIXEL_MEAN) / PIXEL_STD
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def evaluate(model: nn.Module, images, labels, batch: int = 1000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(labels), batch):
            logits = model(images[begin:begin + batch])
            correct += int((logits.argmax(1) == labels[begin:begin + batch]).sum())
    model.train()
    return correct / len(labels)


class LocalOptimizer:
    """The plain PyTorch run's stand-in for shardtrain's optimizer: the same
    calls, a torch.optim optimizer doing the update in this process."""

    def __init__(self, model: nn.Module, name: str, lr: float, momentum: float):
        params = model.parameters()
        if name == "adam":
            self.optimizer = torch.optim.Adam(params, lr=lr)
        elif name == "adamw":
            self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        elif name in ("momentum", "nesterov"):
            self.optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum,
                                             nesterov=name == "nesterov")
        elif name == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=lr)
        elif name == "adagrad":
            self.optimizer = torch.optim.Adagrad(params, lr=lr, eps=1e-8)
        else:
            raise ValueError(f"--optimizer {name!r}: want adam, adamw, sgd, momentum, "
                             "nesterov or adagrad")
        self.description = f"{name} lr={lr:g}"
        self.clock = 0
        self.first_step = 0
        self.last_step_stats = {}
        self._start = None  # the step's first forward
        model.register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module, inputs):
        if self._start is None and torch.is_grad_enabled():
            self._start = time.monotonic()

    def step(self, loss=None, samples=None):
        self.optimizer.step()
        self.clock += 1
        self.last_step_stats = {"compute_seconds": time.monotonic() - self._start}
        self._start = None

    def zero_grad(self):
        self.optimizer.zero_grad()


def format_epoch(e: dict, epochs: int) -> str:
    """ps-worker's epoch line (worker/results.cc FormatEpoch)."""
    accuracy = f"{e['test_accuracy']:.4f}" if e["test_accuracy"] >= 0 else "-"
    return (f"epoch {e['epoch']}/{epochs}  loss {e['train_loss']:.4f}  test_acc {accuracy}  "
            f"samples/s {e['samples_per_second']:.0f}  staleness mean "
            f"{e['mean_staleness']:.2f} max {e['max_staleness']}  time {e['seconds']:.1f}s "
            f"(compute {e['compute_seconds']:.1f} push {e['push_seconds']:.1f} "
            f"pull {e['pull_seconds']:.1f} wait {e['wait_seconds']:.1f})")


def write_results(path: str, run: dict, result: dict):
    """ps-worker's results file (worker/results.cc ResultsJson), atomically."""
    doc = dict(final_test_accuracy=round(result["final_test_accuracy"], 6),
               epochs=run["epochs"], wall_seconds=round(result["wall_seconds"], 3),
               samples_per_second=round(result["samples_per_second"], 1), mode=run["mode"],
               workers=run["workers"], shards=run["shards"], model=run["model"],
               optimizer=run["optimizer"], batch=run["batch"],
               steps_per_worker=result["steps"], per_epoch=result["epochs"])
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="examples per step and worker")
    parser.add_argument("--data", default=DEFAULT_DATA, help="directory of the IDX .gz files")
    parser.add_argument("--results", default="", help="write the results JSON here (chief)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds the initial parameters and the data order")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default, OMP_NUM_THREADS)")
    parser.add_argument("--local", action="store_true",
                        help="one plain PyTorch process, even under shardtrain-run")
    parser.add_argument("--train-examples", type=int, default=0,
                        help="train on the first N examples only (0: all)")
    parser.add_argument("--test-examples", type=int, default=0,
                        help="evaluate on the first N test examples only (0: all 10,000)")
    local = parser.add_argument_group("--local runs (on shardtrain: ps-server flags instead)")
    local.add_argument("--optimizer", default="adam")
    local.add_argument("--lr", type=float, default=0.001)
    local.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args(argv)
    if args.epochs < 0 or args.batch < 1:
        parser.error("--epochs must be >= 0 and --batch >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    distributed = not args.local and bool(os.environ.get("SHARDTRAIN_SERVERS"))
    if distributed:
        import shardtrain.torch as st
        rank, world = st.rank(), st.world_size()
    else:
        rank, world = 0, 1
    chief = rank == 0

    torch.manual_seed(args.seed)
    model = Net()
    train_x, train_y = load_split(args.data, "train")
    if args.train_examples > 0:
        train_x, train_y = train_x[:args.train_examples], train_y[:args.train_examples]
    test_x, test_y = load_split(args.data, "t10k") if chief else (None, None)
    if chief and args.test_examples > 0:
        test_x, test_y = test_x[:args.test_examples], test_y[:args.test_examples]
    sampler = DistributedSampler(TensorDataset(train_x, train_y), num_replicas=world, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // args.batch
    if steps_per_epoch < 1:
        print(f"{len(train_y)} examples over {world} workers give no full batch of "
              f"{args.batch}", file=sys.stderr)
        return 2
    total_steps = args.epochs * steps_per_epoch

    if distributed:
        opt = st.DistributedOptimizer(model, batch_size=args.batch)
        shards = opt.client.status()
        mode, optimizer_name = shards[0]["mode"], shards[0]["optimizer"]
        num_shards = len(shards)
        print(f"worker {rank}/{world} training {MODEL} ({sum(p.numel() for p in model.parameters())}"
              f" parameters) ({mode}, {num_shards} shards, optimizer {optimizer_name}), "
              f"metrics on port {opt.metrics_port}", file=sys.stderr)
    else:
        opt = LocalOptimizer(model, args.optimizer, args.lr, args.momentum)
        mode, optimizer_name, num_shards = "local", opt.description, 0
        print(f"training {MODEL} ({sum(p.numel() for p in model.parameters())} parameters) "
              f"in one PyTorch process, optimizer {optimizer_name}", file=sys.stderr)
    if opt.first_step > 0:
        print(f"resuming at step {opt.first_step} (epoch {opt.first_step // steps_per_epoch + 1}, "
              f"batch {opt.first_step % steps_per_epoch}) of {total_steps}", file=sys.stderr)

    result = {"epochs": [], "final_test_accuracy": -1.0, "steps": 0}
    start = time.monotonic()
    cluster_at_start = opt.cluster_steps() if distributed and chief else 0
    cluster_before = cluster_at_start
    epoch, order = 0, None
    tally = {}
    final_evaluated = False
    while opt.clock < total_steps:
        step = opt.clock
        if step // steps_per_epoch + 1 != epoch:
            epoch = step // steps_per_epoch + 1
            sampler.set_epoch(epoch)
            order = torch.tensor(list(sampler), dtype=torch.int64)
            tally = dict(start=time.monotonic(), loss=0.0, steps=0, staleness=0, max_staleness=0,
                         compute=0.0, pull=0.0, wait=0.0)
        begin = (step % steps_per_epoch) * args.batch
        batch = order[begin:begin + args.batch]
        loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        result["steps"] += 1
        stats = opt.last_step_stats
        tally["loss"] += float(loss)
        tally["steps"] += 1
        tally["staleness"] += stats.get("max_staleness", 0)
        tally["max_staleness"] = max(tally["max_staleness"], stats.get("max_staleness", 0))
        tally["compute"] += stats.get("compute_seconds", 0.0)
        tally["wait"] += stats.get("wait_seconds", 0.0)
        tally["pull"] += stats.get("exchange_seconds", 0.0) - stats.get("wait_seconds", 0.0)
        if opt.clock % steps_per_epoch != 0 or opt.clock // steps_per_epoch != epoch:
            continue
        # This step ended the epoch.
        seconds = time.monotonic() - tally["start"]
        e = dict(epoch=epoch, train_loss=tally["loss"] / tally["steps"], test_accuracy=-1.0,
                 seconds=seconds, samples_per_second=0.0,
                 mean_staleness=tally["staleness"] / tally["steps"],
                 max_staleness=tally["max_staleness"], compute_seconds=tally["compute"],
                 push_seconds=0.0, pull_seconds=tally["pull"], wait_seconds=tally["wait"])
        samples = tally["steps"] * args.batch
        if chief:
            if distributed:
                # Throughput of the whole job, from the clocks the shards have seen.
                cluster = opt.cluster_steps()
                samples = (cluster - cluster_before) * args.batch
                cluster_before = cluster
                if epoch == args.epochs:
                    # The last evaluation waits for everyone: the final model.
                    opt.finish(wait_for_others=True)
                    final_evaluated = True
            elif epoch == args.epochs:
                final_evaluated = True
            e["test_accuracy"] = evaluate(model, test_x, test_y)
        e["samples_per_second"] = samples / max(seconds, 1e-9)
        result["epochs"].append(e)
        if chief:
            print(format_epoch(e, args.epochs), flush=True)
            if distributed:
                opt.record_epoch(epoch, e["test_accuracy"], e["samples_per_second"])
        epoch = 0

    if distributed and not final_evaluated:
        opt.finish(wait_for_others=chief)
    if chief and not final_evaluated:
        result["final_test_accuracy"] = evaluate(model, test_x, test_y)
    elif result["epochs"]:
        result["final_test_accuracy"] = result["epochs"][-1]["test_accuracy"]
    result["wall_seconds"] = time.monotonic() - start
    steps_all = result["steps"]
    if distributed and chief:
        steps_all = opt.cluster_steps() - cluster_at_start
    result["samples_per_second"] = steps_all * args.batch / max(result["wall_seconds"], 1e-9)
    if chief:
        print(f"final test accuracy: {result['final_test_accuracy']:.4f}", flush=True)
        if args.results:
            write_results(args.results, dict(mode=mode, workers=world, shards=num_shards,
                                             model=MODEL, optimizer=optimizer_name,
                                             batch=args.batch, epochs=args.epochs), result)
    print(f"worker {rank} finished {result['steps']} steps in {result['wall_seconds']:.1f} s",
          file=sys.stderr)
    if distributed:
        opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
