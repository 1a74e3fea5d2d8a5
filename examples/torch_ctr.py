#!/usr/bin/env python3
"""A DLRM-style click-through-rate model with its embeddings in a shardtrain
sparse table, on shardtrain or alone.

On shardtrain (N workers, each training on its own stream; the shards hold
the embedding table's rows and the dense layers, and run the optimizers):

  scripts/shardtrain-run --workers 2 --shards 2 -- python3 examples/torch_ctr.py

As one plain PyTorch process (the same model, data and optimizers, with the
embeddings in an nn.EmbeddingBag(sparse=True) of --local_rows hashed rows;
for comparison), with --local or whenever SHARDTRAIN_SERVERS is unset:

  /usr/bin/python3 examples/torch_ctr.py --local

The model: 26 categorical fields share one table of dim --dim (a field's
id x is the table id field << 56 | x, so fields never collide); 13 dense
features go through a bottom MLP; the 27 vectors' pairwise dot products and
the bottom output feed a top MLP (DLRM, Naumov et al. 2019). The table
trains with Adagrad (lr --emb_lr) on the shards; the dense layers with the
shards' optimizer (shardtrain-run's default Adam, lr 0.001).

The data. By default a deterministic synthetic stream shaped like Criteo's
display-advertising data: 26 fields with cardinalities log-spaced from 10
to 10^8, ids drawn Zipf(--alpha), 13 normal dense features, and labels drawn
from a hidden teacher (a linear term of the dense features plus a rank-4
factorisation machine over the 26 fields, whose factors shrink with an id's
rarity as real logs' do), so the best AUC any model can reach on the test
set is known: the teacher's own, printed beside the model's. With
--multi_hot K every field of a sample holds 1 to K ids (a bag, as a user's
recent items or a page's keywords), whose factors the teacher averages and
the model mean-pools. Each worker streams its own seed; the test
set (--test samples) is the same for everyone. --criteo FILE reads Criteo's
TSV format instead (label, 13 integers, 26 hexadecimal categoricals; empty
fields allowed), the last --test lines as the test set.

Every epoch the chief (worker 0) prints loss, AUC, logloss, samples/s and
the rows stored; --results FILE writes them as JSON.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FIELDS = 26
DENSE = 13
CARDINALITIES = np.round(np.logspace(1, 8, FIELDS)).astype(np.int64)
MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x):
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def hashed_normal(keys, salt):
    """N(0, 1) per uint64 key, a pure function of (key, salt)."""
    h = mix64(np.asarray(keys, np.uint64) ^ np.uint64(salt))
    u1 = ((h >> np.uint64(40)).astype(np.float64) + 0.5) / 16777216.0
    u2 = ((h & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) / 16777216.0
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def table_ids(raw):
    """Per-field raw ids [n, 26, K] -> the shared table's ids (field << 56 | id)."""
    fields = (np.arange(FIELDS, dtype=np.uint64) << np.uint64(56))[:, None]
    return (raw.astype(np.uint64) | fields).view(np.int64)


def bags(ids):
    """Ids [n, 26, K], -1 where a bag has no more ids -> (the ids in order,
    the offset of each of the n * 26 bags), as nn.EmbeddingBag takes them."""
    present = ids >= 0
    counts = present.sum(-1).reshape(-1)
    offsets = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return ids[present], offsets


class Synthetic:
    """Criteo-shaped samples whose labels come from a hidden teacher FM."""

    def __init__(self, alpha=1.1, teacher_seed=20261127, k=4, multi_hot=1):
        self.alpha = alpha
        self.k = k
        self.multi_hot = multi_hot
        self.salt = teacher_seed
        rng = np.random.default_rng(teacher_seed)
        self.dense_w = rng.normal(0.0, 0.3, DENSE)
        self.bias = -1.2  # about a quarter of the samples are clicks

    def _teacher(self, dense, ids):
        present = ids >= 0  # [n, 26, K]
        keys = np.where(present, ids, 0).view(np.uint64)
        # Rare ids say little (as in real logs): an id's weights shrink with
        # its Zipf rank (its raw id), so what decides a label can be learnt.
        rank = (keys & np.uint64((1 << 56) - 1)).astype(np.float64)
        scale = present / (1.0 + rank / 10.0)
        factors = np.stack([0.5 * scale * hashed_normal(keys, self.salt + 1 + j)
                            for j in range(self.k)], axis=-1)  # [n, 26, K, k]
        # A bag's factor is the mean of its ids'.
        factors = factors.sum(2) / present.sum(-1, keepdims=True)  # [n, 26, k]
        s = factors.sum(1)
        pairwise = 0.5 * ((s * s).sum(-1) - (factors * factors).sum((1, 2)))
        return self.bias + dense @ self.dense_w + pairwise

    def batch(self, n, rng):
        """(dense [n, 13] f32, ids [n, 26, K] int64 (-1: no more ids in that
        field's bag), labels [n] f32, teacher p [n])."""
        k = self.multi_hot
        raw = (rng.zipf(self.alpha, size=(n, FIELDS, k)) - 1) % CARDINALITIES[:, None]
        ids = table_ids(raw)
        if k > 1:  # 1 to K ids in each bag
            sizes = rng.integers(1, k + 1, size=(n, FIELDS, 1))
            ids = np.where(np.arange(k) < sizes, ids, -1)
        dense = rng.standard_normal((n, DENSE)).astype(np.float32)
        p = 1.0 / (1.0 + np.exp(-self._teacher(dense.astype(np.float64), ids)))
        labels = (rng.random(n) < p).astype(np.float32)
        return dense, ids, labels, p


def read_criteo(path):
    """Criteo TSV: label, 13 integers, 26 hex categoricals (empty allowed)."""
    dense, raw, labels = [], [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 1 + DENSE + FIELDS:
                raise ValueError(f"{path}:{number}: {len(cols)} columns, not 40")
            labels.append(float(cols[0]))
            dense.append([np.log1p(max(int(c), 0)) if c else 0.0 for c in cols[1:1 + DENSE]])
            # 0: missing; a value v is v + 1 (values are 32-bit hex hashes).
            raw.append([int(c, 16) + 1 if c else 0 for c in cols[1 + DENSE:]])
    return (np.asarray(dense, np.float32), table_ids(np.asarray(raw, np.uint64)[:, :, None]),
            np.asarray(labels, np.float32))


def auc(labels, scores):
    """Area under the ROC curve (ties share ranks)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    ranks_sorted = np.arange(1, len(scores) + 1, dtype=np.float64)
    # Average the ranks of tied scores.
    _, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for s, c in zip(start[counts > 1], counts[counts > 1]):
        ranks_sorted[s:s + c] = ranks_sorted[s:s + c].mean()
    ranks[order] = ranks_sorted
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels, p):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class HashedEmbedding(nn.Module):
    """The plain-PyTorch baseline's table: ids hashed into `rows` rows."""

    def __init__(self, rows, dim):
        super().__init__()
        self.rows = rows
        self.bag = nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        nn.init.uniform_(self.bag.weight, -0.01, 0.01)

    def forward(self, ids, offsets=None):
        index = mix64(ids.numpy().view(np.uint64)) % np.uint64(self.rows)
        index = torch.from_numpy(index.astype(np.int64)).view(ids.shape)
        return self.bag(index, offsets)


class DLRM(nn.Module):
    def __init__(self, embedding, dim):
        super().__init__()
        self.emb = embedding
        self.dim = dim
        self.bottom = mlp([DENSE, 64, dim])
        pairs = (FIELDS + 1) * FIELDS // 2
        self.top = mlp([dim + pairs, 64, 1])
        self.register_buffer("upper", torch.triu_indices(FIELDS + 1, FIELDS + 1, offset=1),
                             persistent=False)

    @staticmethod
    def bags(ids):
        """ids [n, 26, K] as the embedding's input: (ids, offsets or None)."""
        if ids.shape[2] == 1:
            return ids.reshape(-1, 1), None
        flat, offsets = bags(ids.numpy())
        return torch.from_numpy(flat), torch.from_numpy(offsets)

    def prefetch(self, ids):
        """Starts the lookup of a later batch's rows (SparseEmbedding.prefetch)."""
        self.emb.prefetch(self.bags(ids)[0])

    def forward(self, dense, ids):
        """ids [n, 26, K]: each field's bag of ids, -1 after its last."""
        n = dense.shape[0]
        flat, offsets = self.bags(ids)
        e = self.emb(flat) if offsets is None else self.emb(flat, offsets)
        e = e.view(n, FIELDS, self.dim)
        d = self.bottom(dense)
        z = torch.cat([d.unsqueeze(1), e], 1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([d, inter], 1)).squeeze(1)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=100_000,
                   help="training samples per worker per epoch (synthetic data)")
    p.add_argument("--test", type=int, default=50_000, help="test samples")
    p.add_argument("--batch", type=int, default=512, help="batch per worker")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--emb_lr", type=float, default=0.1, help="the table's Adagrad lr")
    p.add_argument("--table_mode", choices=["async", "sync"], default="async",
                   help="the table's consistency: async (applied as pushes come) or sync "
                        "(each step's mean over the workers); the dense part follows "
                        "shardtrain-run --mode")
    p.add_argument("--table_dtype", choices=["f32", "bf16"], default="f32",
                   help="how the shards store the table's values: f32, or bf16 in half "
                        "the memory (rounded stochastically)")
    p.add_argument("--lr", type=float, default=0.001, help="--local: the dense layers' Adam lr")
    p.add_argument("--alpha", type=float, default=1.1, help="Zipf exponent of the ids")
    p.add_argument("--multi_hot", type=int, default=1,
                   help="synthetic data: each field holds 1 to this many ids (mean-pooled)")
    p.add_argument("--prefetch", action="store_true",
                   help="look the next batch's rows up while this one computes (async "
                        "tables; rows one step staler)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--criteo", default="", help="a Criteo TSV file instead of synthetic data")
    p.add_argument("--local", action="store_true", help="one plain PyTorch process")
    p.add_argument("--local_rows", type=int, default=1 << 22,
                   help="--local: rows of the hashed nn.EmbeddingBag")
    p.add_argument("--results", default="", help="write per-epoch figures here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    distributed = not args.local and bool(os.environ.get("SHARDTRAIN_SERVERS"))
    if args.prefetch and args.table_mode == "sync":
        sys.exit("--prefetch needs --table_mode async: a sync table's lookup waits for the "
                 "step's pushes")
    prefetch = args.prefetch and distributed
    worker, workers = 0, 1
    if distributed:
        import shardtrain.torch as st
        worker, workers = st.rank(), st.world_size()
        emb = st.SparseEmbedding("ctr", args.dim, mode="mean", optimizer="adagrad",
                                 learning_rate=args.emb_lr, init="uniform", init_scale=0.01,
                                 seed=args.seed, sync=args.table_mode == "sync",
                                 storage_dtype=args.table_dtype)
    else:
        emb = HashedEmbedding(args.local_rows, args.dim)
    model = DLRM(emb, args.dim)

    if args.multi_hot < 1:
        sys.exit(f"--multi_hot {args.multi_hot}: at least 1")
    synthetic = None if args.criteo else Synthetic(alpha=args.alpha, multi_hot=args.multi_hot)
    if synthetic is not None:
        test = synthetic.batch(args.test, np.random.default_rng(10_000 + args.seed))
        teacher_auc = auc(test[2], test[3])
        train_stream = np.random.default_rng(args.seed * 1000 + worker)
        steps = args.samples // args.batch
    else:
        dense, ids, labels = read_criteo(args.criteo)
        if len(labels) <= args.test:
            sys.exit(f"{args.criteo}: {len(labels)} lines, not more than --test {args.test}")
        test = (dense[-args.test:], ids[-args.test:], labels[-args.test:], None)
        train = (dense[:-args.test], ids[:-args.test], labels[:-args.test])
        mine = np.arange(worker, len(train[2]), workers)
        teacher_auc = float("nan")
        # The same number of steps on every worker (a sync table's step
        # needs every worker's push).
        steps = len(train[2]) // workers // args.batch

    if distributed:
        opt = st.DistributedOptimizer(model, batch_size=args.batch)
        dense_opt = sparse_opt = None
    else:
        opt = None
        dense_opt = torch.optim.Adam([p for n, p in model.named_parameters()
                                      if not n.startswith("emb.")], lr=args.lr)
        sparse_opt = torch.optim.Adagrad(emb.parameters(), lr=args.emb_lr)

    def evaluate():
        model.eval()
        scores = []
        with torch.no_grad():
            for i in range(0, len(test[2]), 8192):
                d = torch.from_numpy(test[0][i:i + 8192])
                x = torch.from_numpy(test[1][i:i + 8192])
                scores.append(torch.sigmoid(model(d, x)).numpy())
        model.train()
        p = np.concatenate(scores).astype(np.float64)
        return auc(test[2], p), logloss(test[2], p)

    def rows_stored():
        if not distributed:
            return args.local_rows  # all allocated up front
        # By (table, replica group): with replicated shards a row is on
        # every member of its group's chain (and a dead member counts none).
        rows = {}
        for shard in opt.client.status():
            for t in shard.get("tables", []):
                for g in t["groups"]:
                    key = (t["name"], g["group"])
                    rows[key] = max(rows.get(key, 0), g["rows"])
        return sum(rows.values())

    history = []
    where = (f"{workers} workers on shardtrain, {args.table_mode} table" if distributed else
             f"one PyTorch process, nn.EmbeddingBag of {args.local_rows} hashed rows")
    if worker == 0:
        print(f"torch_ctr: DLRM, dim {args.dim}, {where}; "
              f"{'teacher AUC %.4f' % teacher_auc if synthetic else args.criteo}", flush=True)
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        total, seen = 0.0, 0
        order = None if synthetic else np.random.default_rng(args.seed + epoch).permutation(mine)

        def batch(step):
            if synthetic is not None:
                d, x, y, _ = synthetic.batch(args.batch, train_stream)
            else:
                rows = order[step * args.batch:(step + 1) * args.batch]
                d, x, y = train[0][rows], train[1][rows], train[2][rows]
            return torch.from_numpy(d), torch.from_numpy(x), torch.from_numpy(y)

        following = batch(0) if steps > 0 else None
        if prefetch and following is not None:
            model.prefetch(following[1])
        for step in range(steps):
            d, x, y = following
            if step + 1 < steps:
                # The next batch is made (and with --prefetch its rows are
                # on their way) before this one computes.
                following = batch(step + 1)
                if prefetch:
                    model.prefetch(following[1])
            loss = F.binary_cross_entropy_with_logits(model(d, x), y)
            if distributed:
                loss.backward()
                opt.step(loss=loss)
                opt.zero_grad()
            else:
                dense_opt.zero_grad()
                sparse_opt.zero_grad()
                loss.backward()
                dense_opt.step()
                sparse_opt.step()
            total += float(loss) * len(y)
            seen += len(y)
        rate = seen * workers / (time.monotonic() - start)
        if worker == 0:
            test_auc, test_logloss = evaluate()
            rows = rows_stored()
            history.append(dict(epoch=epoch, loss=total / max(seen, 1), auc=test_auc,
                                logloss=test_logloss, samples_per_second=rate,
                                rows_stored=rows))
            print(f"epoch {epoch}: loss {total / max(seen, 1):.4f} AUC {test_auc:.4f} "
                  f"logloss {test_logloss:.4f} samples/s {rate:.0f} rows {rows}"
                  + (f" (teacher AUC {teacher_auc:.4f})" if synthetic else ""), flush=True)
    if distributed:
        opt.finish(wait_for_others=True)
        opt.close()
    if worker == 0 and args.results:
        with open(args.results, "w") as f:
            json.dump(dict(model="dlrm", where=where, teacher_auc=teacher_auc,
                           epochs=history), f, indent=1)
    return history


if __name__ == "__main__":
    main()
