#!/usr/bin/env python3
"""A tiny shardtrain.torch job for the install tests, run by an installed
shardtrain-run: each worker fits y = 3x - 1 with a 1x1 linear model on the
shards (sync SGD), then worker 0 checks that the loss fell and, given
--psctl PATH, that `psctl status` reads the shards. Prints "tiny job OK".

  shardtrain-run --workers 2 --shards 2 --mode sync --optimizer sgd --lr 0.1 \
      -- tiny_job.py [--psctl psctl]
"""
import argparse
import subprocess
import sys

import torch

import shardtrain
import shardtrain.torch as st
from shardtrain import env


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--psctl", default="")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    torch.manual_seed(st.rank())
    model = torch.nn.Linear(1, 1)
    opt = st.DistributedOptimizer(model, batch_size=16)
    losses = []
    while opt.clock < args.steps:
        x = torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        losses.append(float(loss))
    chief = st.rank() == 0
    opt.finish(wait_for_others=chief)
    print(f"worker {st.rank()}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"shardtrain {shardtrain.__version__} from {shardtrain.__file__}", flush=True)
    if not losses[-1] < 0.5 * losses[0]:
        print("the loss did not fall", file=sys.stderr)
        return 1
    if chief and args.psctl:
        servers = env.from_environ().servers
        status = subprocess.run([args.psctl, "status", "--servers=" + ",".join(servers)],
                                capture_output=True, text=True, timeout=60)
        print(status.stdout, end="")
        if status.returncode != 0:
            print(f"psctl status failed: {status.stderr}", file=sys.stderr)
            return 1
    if chief:
        print("tiny job OK", flush=True)
    opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
