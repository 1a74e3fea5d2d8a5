#!/usr/bin/env python3
"""A character-level GPT trained on Vim's help files with PyTorch, on shardtrain or alone.

The model is nanoGPT's CPU configuration: 4 layers, 4 heads, 128 wide, a
context of 64 characters, no dropout, the output layer tied to the token
embedding (0.81 M parameters). The vocabulary is the 95 printable ASCII
characters, tab and newline, and one token for every other character.

On shardtrain (N workers, each sampling its own random windows; the shards
hold the parameters and run Adam with the Noam schedule,
lr(s) = lr * min((s+1)/W, sqrt(W/(s+1))), s the update count; in async mode
the shards count pushes / N, so async and sync share one schedule):

  scripts/shardtrain-run --workers 2 --shards 2 --mode sync \\
      --optimizer adam --lr 0.002 --lr_schedule noam --warmup_steps 100 -- \\
      /usr/bin/python3 examples/torch_gpt.py
  scripts/shardtrain-run --workers 2 --shards 2 --mode async --max_staleness 4 \\
      --optimizer adam --lr 0.002 --lr_schedule noam --warmup_steps 100 -- \\
      /usr/bin/python3 examples/torch_gpt.py

As one plain PyTorch process (the same model and windows; torch.optim.Adam
with the same schedule, in this process), with --baseline or whenever
SHARDTRAIN_SERVERS is unset. Sync N workers with --batch B step like one
process with --batch N*B, so compare with:

  /usr/bin/python3 examples/torch_gpt.py --baseline --batch 24 --threads 1 \\
      --lr 0.002 --lr-schedule noam --warmup-steps 100

Momentum instead of Adam: --worker-momentum 0.9 makes each worker push
DANA-Slim's Nesterov step (shardtrain.torch.DistributedOptimizer's
worker_momentum) to shards that run plain SGD (shardtrain-run --optimizer
sgd --lr 0.03 --lr_schedule noam --warmup_steps 50); its baseline is
--baseline --optimizer nesterov --momentum 0.9 --lr 0.03 --warmup-steps 50.

The chief (worker 0) prints, every --eval-interval iterations, the mean
training loss of its own batches in that interval, the loss on fixed
validation windows, and the whole job's tokens per second; --results FILE
writes a JSON summary (final_val_loss, tokens_per_second, per_interval[...]).
An iteration is one step of every worker: --iters steps per worker.

The corpus: the *.txt files of --data (default /usr/share/vim/vim90/doc,
the help of Debian's vim-runtime package: `apt-get install vim-runtime`;
151 files, 9.5 M characters). They are Vim's documentation, distributed under the Vim
license (/usr/share/vim/vim90/doc/uganda.txt); this script reads them
locally and ships none of their text. The split is deterministic: in name
order, every tenth file (the 2nd, 12th, 22nd, ...) is validation, the rest
training (about a 90/10 split by size). Nothing is downloaded.
"""

import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _vim_doc() -> str:
    """vim-runtime's help directory (vim90 on Debian 12)."""
    found = sorted(glob.glob("/usr/share/vim/vim[0-9]*/doc"))
    return found[-1] if found else "/usr/share/vim/vim90/doc"


DEFAULT_DATA = _vim_doc()
# Token ids: tab, newline, the printable ASCII characters, then "other".
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = len(CHARS) + 1
OTHER = len(CHARS)
# Fixed validation windows are drawn with this seed, whatever --seed is.
EVAL_SEED = 1234


def load_corpus(directory: str):
    """(train, val) token ids (int64 tensors) of the *.txt files in directory."""
    files = sorted(glob.glob(os.path.join(directory, "*.txt")))
    if not files:
        raise FileNotFoundError(f"no *.txt files in {directory} (apt-get install vim-runtime)")
    table = np.full(128, OTHER, dtype=np.int64)
    for i, c in enumerate(CHARS):
        table[ord(c)] = i
    parts = {"train": [], "val": []}
    for index, path in enumerate(files):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.where(codes < 128, table[np.minimum(codes, 127)], OTHER)
        parts["val" if index % 10 == 1 else "train"].append(ids)
    return tuple(torch.from_numpy(np.concatenate(parts[k])) for k in ("train", "val"))


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, block: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, block: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """nanoGPT's decoder: pre-LayerNorm blocks, learned positions, tied output."""

    def __init__(self, layers: int, heads: int, width: int, block: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.block = block
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads, block) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.tokens.weight
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                # GPT-2's: N(0, 0.02), residual projections scaled by depth.
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        t = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def windows(data, starts, block: int):
    """Inputs and next-character targets of the windows beginning at starts."""
    offsets = torch.arange(block)
    x = data[starts[:, None] + offsets]
    y = data[starts[:, None] + offsets + 1]
    return x, y


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def evaluate(model, batches) -> float:
    model.eval()
    with torch.no_grad():
        total = sum(float(lm_loss(model, x, y)) for x, y in batches)
    model.train()
    return total / len(batches)


def noam(step: int, warmup: int) -> float:
    """The shards' --lr_schedule=noam factor at update count `step`."""
    return min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


class LocalOptimizer:
    """The plain PyTorch run's stand-in for shardtrain's optimizer: the same
    calls, a torch.optim optimizer and the shards' schedule in this process."""

    def __init__(self, model: nn.Module, args):
        params = model.parameters()
        if args.optimizer == "adam":
            self.optimizer = torch.optim.Adam(params, lr=args.lr)
        elif args.optimizer in ("momentum", "nesterov"):
            self.optimizer = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum,
                                             nesterov=args.optimizer == "nesterov")
        elif args.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=args.lr)
        else:
            raise ValueError(f"--optimizer {args.optimizer!r}: want adam, sgd, momentum or "
                             "nesterov")
        if args.lr_schedule == "noam":
            factor = lambda step: noam(step, args.warmup_steps)  # noqa: E731
        else:
            factor = lambda step: 1.0  # noqa: E731
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.description = f"{args.optimizer} lr={args.lr:g} schedule={args.lr_schedule}"
        if args.lr_schedule == "noam":
            self.description += f" warmup={args.warmup_steps}"
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
        self.schedule.step()
        self.clock += 1
        self.last_step_stats = {"compute_seconds": time.monotonic() - self._start}
        self._start = None

    def zero_grad(self):
        self.optimizer.zero_grad()


def format_interval(e: dict, iters: int) -> str:
    return (f"iter {e['iter']}/{iters}  train_loss {e['train_loss']:.4f}  "
            f"val_loss {e['val_loss']:.4f}  tokens/s {e['tokens_per_second']:.0f}  "
            f"staleness mean {e['mean_staleness']:.2f} max {e['max_staleness']}  "
            f"time {e['seconds']:.1f}s (compute {e['compute_seconds']:.1f} "
            f"pull {e['pull_seconds']:.1f} wait {e['wait_seconds']:.1f})")


def write_results(path: str, doc: dict):
    """The results JSON, atomically."""
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
    parser.add_argument("--iters", type=int, default=300, help="steps per worker")
    parser.add_argument("--batch", type=int, default=12, help="windows per step and worker")
    parser.add_argument("--block", type=int, default=64, help="context length in characters")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--eval-interval", type=int, default=100,
                        help="iterations between evaluations (and the last one)")
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="fixed validation windows of each evaluation")
    parser.add_argument("--data", default=DEFAULT_DATA, help="directory of the *.txt files")
    parser.add_argument("--max-chars", type=int, default=0,
                        help="use the first N characters of the training split and N/10 of "
                             "the validation split (0: all)")
    parser.add_argument("--results", default="", help="write the results JSON here (chief)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds the initial parameters and the windows (worker i: seed + i)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default, OMP_NUM_THREADS)")
    parser.add_argument("--baseline", "--local", dest="baseline", action="store_true",
                        help="one plain PyTorch process, even under shardtrain-run")
    parser.add_argument("--worker-momentum", type=float, default=0.0,
                        help="on shardtrain: DANA-Slim momentum on the workers (the shards "
                             "must run --optimizer sgd)")
    local = parser.add_argument_group("--baseline runs (on shardtrain: ps-server flags instead)")
    local.add_argument("--optimizer", default="adam")
    local.add_argument("--lr", type=float, default=0.002)
    local.add_argument("--momentum", type=float, default=0.9)
    local.add_argument("--lr-schedule", choices=("noam", "constant"), default="noam")
    local.add_argument("--warmup-steps", type=int, default=100)
    args = parser.parse_args(argv)
    if args.iters < 0 or args.batch < 1 or args.block < 1 or args.eval_interval < 1:
        parser.error("--iters must be >= 0, --batch, --block and --eval-interval >= 1")
    if args.warmup_steps < 1:
        parser.error("--warmup-steps must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    distributed = not args.baseline and bool(os.environ.get("SHARDTRAIN_SERVERS"))
    if distributed:
        import shardtrain.torch as st
        rank, world = st.rank(), st.world_size()
    else:
        rank, world = 0, 1
    chief = rank == 0

    train, val = load_corpus(args.data)
    if args.max_chars > 0:
        train, val = train[:args.max_chars], val[:max(args.max_chars // 10, args.block + 1)]
    if len(train) <= args.block or len(val) <= args.block:
        print(f"the corpus is shorter than --block {args.block}", file=sys.stderr)
        return 2
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    eval_starts = torch.randint(len(val) - args.block, (args.eval_windows,), generator=eval_gen)
    eval_batches = [windows(val, eval_starts[i:i + 64], args.block)
                    for i in range(0, args.eval_windows, 64)] if chief else []

    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.heads, args.width, args.block)
    parameters = sum(p.numel() for p in model.parameters())
    model_name = f"gpt:l{args.layers}-h{args.heads}-w{args.width}-b{args.block}"
    if distributed:
        opt = st.DistributedOptimizer(model, batch_size=args.batch,
                                      worker_momentum=args.worker_momentum)
        shards = opt.client.status()
        mode, optimizer_name, num_shards = shards[0]["mode"], shards[0]["optimizer"], len(shards)
        if args.worker_momentum > 0:
            optimizer_name += f" + worker momentum {args.worker_momentum:g} (DANA-Slim)"
        print(f"worker {rank}/{world} training {model_name} ({parameters} parameters) on "
              f"{len(train)} characters ({mode}, {num_shards} shards, optimizer "
              f"{optimizer_name}), metrics on port {opt.metrics_port}", file=sys.stderr)
    else:
        opt = LocalOptimizer(model, args)
        mode, optimizer_name, num_shards = "local", opt.description, 0
        print(f"training {model_name} ({parameters} parameters) on {len(train)} characters "
              f"in one PyTorch process, optimizer {optimizer_name}", file=sys.stderr)
    if opt.first_step > 0:
        print(f"resuming at iteration {opt.first_step} of {args.iters}", file=sys.stderr)

    gen = torch.Generator().manual_seed(args.seed + rank)
    tokens_per_step = args.batch * args.block
    result = {"intervals": [], "final_val_loss": -1.0, "steps": 0}
    start = time.monotonic()
    cluster_at_start = opt.cluster_steps() if distributed and chief else 0
    cluster_before = cluster_at_start
    tally = None
    final_evaluated = False
    while opt.clock < args.iters:
        if tally is None:
            tally = dict(start=time.monotonic(), loss=0.0, steps=0, staleness=0,
                         max_staleness=0, compute=0.0, pull=0.0, wait=0.0)
        starts = torch.randint(len(train) - args.block, (args.batch,), generator=gen)
        x, y = windows(train, starts, args.block)
        loss = lm_loss(model, x, y)
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
        last = opt.clock >= args.iters
        if opt.clock % args.eval_interval != 0 and not last:
            continue
        seconds = time.monotonic() - tally["start"]
        e = dict(iter=opt.clock, train_loss=tally["loss"] / tally["steps"], val_loss=-1.0,
                 seconds=seconds, tokens_per_second=0.0,
                 mean_staleness=tally["staleness"] / tally["steps"],
                 max_staleness=tally["max_staleness"], compute_seconds=tally["compute"],
                 pull_seconds=tally["pull"], wait_seconds=tally["wait"])
        tokens = tally["steps"] * tokens_per_step
        if chief:
            if distributed:
                # Throughput of the whole job, from the clocks the shards have seen.
                cluster = opt.cluster_steps()
                tokens = (cluster - cluster_before) * tokens_per_step
                cluster_before = cluster
                if last:
                    # The last evaluation waits for everyone: the final model.
                    opt.finish(wait_for_others=True)
            final_evaluated = last
            e["val_loss"] = evaluate(model, eval_batches)
        e["tokens_per_second"] = tokens / max(seconds, 1e-9)
        result["intervals"].append(e)
        if chief:
            print(format_interval(e, args.iters), flush=True)
        tally = None

    if distributed and not final_evaluated:
        opt.finish(wait_for_others=chief)
    if chief and not final_evaluated:
        result["final_val_loss"] = evaluate(model, eval_batches)
    elif result["intervals"]:
        result["final_val_loss"] = result["intervals"][-1]["val_loss"]
    result["wall_seconds"] = time.monotonic() - start
    steps_all = result["steps"]
    if distributed and chief:
        steps_all = opt.cluster_steps() - cluster_at_start
    tokens_per_second = steps_all * tokens_per_step / max(result["wall_seconds"], 1e-9)
    if chief:
        print(f"final val loss: {result['final_val_loss']:.4f}  tokens/s {tokens_per_second:.0f}",
              flush=True)
        if args.results:
            write_results(args.results, dict(
                final_val_loss=round(result["final_val_loss"], 6),
                final_train_loss=round(result["intervals"][-1]["train_loss"], 6)
                if result["intervals"] else None,
                iters=args.iters, wall_seconds=round(result["wall_seconds"], 3),
                tokens_per_second=round(tokens_per_second, 1), mode=mode, workers=world,
                shards=num_shards, model=model_name, parameters=parameters,
                optimizer=optimizer_name, batch=args.batch, block=args.block,
                train_characters=len(train), steps_per_worker=result["steps"],
                per_interval=result["intervals"]))
    print(f"worker {rank} finished {result['steps']} steps in {result['wall_seconds']:.1f} s",
          file=sys.stderr)
    if distributed:
        opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
