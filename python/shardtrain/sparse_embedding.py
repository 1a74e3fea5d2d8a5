"""SparseEmbedding: an nn.EmbeddingBag whose rows live in a sparse table on
the parameter-server shards (see README, "Recommendation models").

The table holds any 64-bit ids; no worker holds it whole. forward() looks up
the rows of the batch's unique ids (creating unseen ones on the shards when
training, admission permitting), pools them like nn.EmbeddingBag (sum or
mean over bags given by offsets, or over the rows of a 2-D input, with
optional per-sample weights), and backward() pushes each unique id's row
gradient; the shards apply the table's optimizer to those rows (lazily:
rows not in the batch keep their state). The dense part of the model
trains as before through DistributedOptimizer, which attaches its client
to every SparseEmbedding of the model it is given:

    emb = shardtrain.torch.SparseEmbedding("user_id", 16, optimizer="rowwise_adagrad",
                                           learning_rate=0.05)
    model = nn.Sequential(...)        # uses emb
    opt = shardtrain.torch.DistributedOptimizer(model)    # attaches emb
    loss = model(batch).sum(); loss.backward(); opt.step()

Outside DistributedOptimizer, attach a shardtrain.Client yourself:
emb.attach(client), and call emb.flush() after backward() when the pushes
must have been applied. Rows come back to the input's device (from pinned
host memory for CUDA inputs); in eval() mode lookups store nothing.

Overlap. The client runs table calls on a thread of its own, in the order
they were made. backward() only starts its push: it travels and is applied
while the rest of backward, the dense exchange and the next batch's
preparation run; DistributedOptimizer.step() waits for it (in sync mode
before its held-back dense push, so the hybrid's order is kept), and the
next lookup follows it on the shards. prefetch(batch) starts the lookup of a
later batch at once (async tables only), so that its rows travel while the
current batch computes; its forward(batch) then takes them. Such rows miss
the pushes made between the prefetch and the forward (one step staler, as
PERSIA's prefetching workers), so a prefetch is opt-in.
"""

import collections
from typing import Optional

import numpy
import torch
import torch.nn.functional as F


class SparseEmbedding(torch.nn.Module):
    def __init__(self, name: str, dim: int, *, mode: str = "mean",
                 optimizer: str = "rowwise_adagrad", learning_rate: float = 0.01,
                 init: str = "uniform", init_scale: float = 0.01, seed: int = 0,
                 wire_dtype: str = "f32", storage_dtype: str = "f32", client=None,
                 **table_options):
        """`name`: the table's name on the shards (the same on every worker).
        `mode`: "sum" or "mean" pooling per bag. `optimizer`: "sgd",
        "adagrad", "rowwise_adagrad", "adam" or "ftrl", with `learning_rate`.
        `init`: "uniform" (U(-init_scale, init_scale)), "normal" (N(0,
        init_scale²)) or "zeros"; a row's start is a function of (seed, name,
        id) only. `wire_dtype`: "f32", or "bf16" / "f16" to send rows and
        gradients in half the bytes. `storage_dtype`: "f32", or "bf16" for
        the shards to keep each row's values in half the memory (updated in
        f32 and rounded stochastically; the optimizer state stays f32).
        `table_options`:
        further TableSpec fields (eps, beta1, admission="count",
        admission_count=3, capacity=..., eviction="lfu", ttl=..., sync=True,
        ...)."""
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode={mode!r} is not 'sum' or 'mean'")
        if dim < 1:
            raise ValueError(f"dim={dim} is not >= 1")
        inits = {"uniform": "INIT_UNIFORM", "normal": "INIT_NORMAL", "zeros": "INIT_ZEROS"}
        if init not in inits:
            raise ValueError(f"init={init!r} is not one of {sorted(inits)}")
        if wire_dtype not in ("f32", "bf16", "f16"):
            raise ValueError(f"wire_dtype={wire_dtype!r} is not 'f32', 'bf16' or 'f16'")
        storage = {"f32": "DTYPE_F32", "bf16": "DTYPE_BF16"}
        if storage_dtype not in storage:
            raise ValueError(f"storage_dtype={storage_dtype!r} is not 'f32' or 'bf16'")
        self.wire_dtype = wire_dtype
        self.name = name
        self.dim = int(dim)
        self.mode = mode
        self.spec = dict(name=name, dim=self.dim, optimizer=optimizer,
                         learning_rate=float(learning_rate), init=inits[init],
                         init_scale=float(init_scale), seed=int(seed),
                         dtype=storage[storage_dtype], **table_options)
        self._client = None
        self._clock = 0
        self._staging = None  # pinned host rows for CUDA inputs
        self._staged = None   # the CUDA event after the last copy out of it
        self._pushes = []     # TableCalls backward started, not yet waited for
        self._prefetched = collections.deque()  # _Lookups, in forward order
        self.last_stats = {}
        if client is not None:
            self.attach(client)

    def attach(self, client):
        """Registers the table through `client` (idempotent) and uses it."""
        client.register_tables([self.spec])
        if self.wire_dtype != "f32":
            client.set_table_wire_dtype(self.name, self.wire_dtype)
        self._client = client

    @property
    def attached(self) -> bool:
        return self._client is not None

    def extra_repr(self) -> str:
        return f"{self.name!r}, {self.dim}, mode={self.mode!r}, optimizer={self.spec['optimizer']!r}"

    def _start_lookup(self, input: "torch.Tensor", train: bool, clock: int,
                      own_staging: bool) -> "_Lookup":
        """Starts the lookup of input's unique ids on the client's table
        thread. own_staging: a pinned buffer of its own for CUDA inputs (a
        prefetch; otherwise the module's, reused)."""
        flat = input.reshape(-1).to("cpu", torch.int64)
        unique, inverse = torch.unique(flat, return_inverse=True)
        n = unique.numel()
        device = input.device
        if device.type == "cuda":
            if own_staging:
                host = torch.empty(n, self.dim, dtype=torch.float32, pin_memory=True)
            else:
                # The last batch's copy to the device must be done before
                # its staging memory is written again.
                if self._staged is not None:
                    self._staged.synchronize()
                if self._staging is None or self._staging.numel() < n * self.dim:
                    self._staging = torch.empty(max(n * self.dim, 1), dtype=torch.float32,
                                                pin_memory=True)
                host = self._staging[: n * self.dim].view(n, self.dim)
        else:
            host = torch.empty(n, self.dim, dtype=torch.float32)
        ids = unique.numpy().view(numpy.uint64)
        call = self._client.lookup_async(self.name, ids, host.numpy(), train, clock)
        return _Lookup(input, unique, inverse, host, call, clock)

    def _finish_lookup(self, lookup: "_Lookup") -> "torch.Tensor":
        """Waits for the lookup; its rows on the input's device."""
        self.last_stats = lookup.call.wait()
        # The table calls run in order: the pushes started before it are done.
        self.flush()
        device = lookup.input.device
        if device.type != "cuda":
            return lookup.host
        rows = lookup.host.to(device, non_blocking=True)
        self._staged = torch.cuda.Event()
        self._staged.record()
        return rows

    def prefetch(self, input: "torch.Tensor") -> None:
        """Starts the lookup of `input`'s rows now, for a later
        forward(input) (the same ids; prefetched batches are taken in the
        order they were prefetched). Training mode and async tables only: a
        sync table's lookup waits for the pushes of the steps before it,
        which would come after."""
        self._check_ready(input)
        if self.spec.get("sync"):
            raise ValueError(f"prefetch() on sync table {self.name!r}: its lookups wait for "
                             "the step's pushes, which come after; prefetch async tables only")
        if not (self.training and torch.is_grad_enabled()):
            raise ValueError("prefetch() is for training batches (train mode, grad enabled)")
        clock = self._clock + len(self._prefetched)
        self._prefetched.append(self._start_lookup(input, True, clock, own_staging=True))

    def flush(self) -> None:
        """Waits until the pushes backward started have been applied; the
        first error raises."""
        pushes, self._pushes = self._pushes, []
        for call in pushes:
            self.last_stats = call.wait()

    def _check_ready(self, input: "torch.Tensor") -> None:
        if self._client is None:
            raise RuntimeError(
                f"SparseEmbedding {self.name!r} has no client: give the model to "
                "DistributedOptimizer, or call attach(client)")
        if input.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be int64 (or int32), got {input.dtype}")

    def forward(self, input: "torch.Tensor", offsets: Optional["torch.Tensor"] = None,
                per_sample_weights: Optional["torch.Tensor"] = None) -> "torch.Tensor":
        """As nn.EmbeddingBag: a 1-D `input` of ids with `offsets` (bag
        starts), or a 2-D input of fixed-size bags. Returns (bags, dim)."""
        self._check_ready(input)
        device = input.device
        train = self.training and torch.is_grad_enabled()
        if self._prefetched:
            lookup = self._prefetched.popleft()
            if not train or not (lookup.input is input or (
                    lookup.input.shape == input.shape and torch.equal(lookup.input, input))):
                self._prefetched.clear()
                raise ValueError("forward() of a batch other than the one prefetched first "
                                 "(pass the same ids, in the order of the prefetches, "
                                 "in training mode)")
        else:
            lookup = self._start_lookup(input, train, self._clock, own_staging=False)
        rows = self._finish_lookup(lookup)
        unique = lookup.unique
        if train:
            rows.requires_grad_(True)
            unique_ids = unique.numpy().view(numpy.uint64).copy()
            clock = lookup.clock
            rows.register_hook(lambda grad: self._push(unique_ids, grad, clock))
            self._clock += 1
        inverse = lookup.inverse.to(device).view(input.shape)
        if input.dim() == 2:
            return F.embedding_bag(inverse, rows, mode=self.mode,
                                   per_sample_weights=per_sample_weights)
        return F.embedding_bag(inverse, rows, offsets.to(device), mode=self.mode,
                               per_sample_weights=per_sample_weights)

    def _push(self, ids: numpy.ndarray, grad: "torch.Tensor", clock: int):
        grad = grad.detach().to("cpu", torch.float32).contiguous()
        # Started only: flush() (DistributedOptimizer.step(), the next
        # lookup) waits for it. The handle holds grad until it has run.
        self._pushes.append(
            self._client.push_sparse_async(self.name, ids, grad.numpy(), clock + 1))
        return None


class _Lookup:
    """A lookup started: the batch, its unique ids and inverse index, the
    host rows the client writes, and the client's TableCall."""

    __slots__ = ("input", "unique", "inverse", "host", "call", "clock")

    def __init__(self, input, unique, inverse, host, call, clock):
        self.input = input
        self.unique = unique
        self.inverse = inverse
        self.host = host
        self.call = call
        self.clock = clock
