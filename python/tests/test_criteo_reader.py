"""examples/torch_ctr.py's data: the reader of Criteo's display-advertising
TSV (label, 13 integer features, 26 hexadecimal categoricals, empty fields
allowed) on a file the test writes, and a short local run on it; the
synthetic stream's multi-hot bags (--multi_hot)."""

import importlib.util
import os

import numpy as np
import pytest

from torch_fixtures import REPO

pytest.importorskip("torch", reason="python3-torch is not installed")

spec = importlib.util.spec_from_file_location("torch_ctr",
                                              os.path.join(REPO, "examples", "torch_ctr.py"))
torch_ctr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_ctr)


def line(label, ints, cats):
    return "\t".join([str(label)] + [("" if v is None else str(v)) for v in ints]
                     + [("" if c is None else c) for c in cats]) + "\n"


def test_reads_labels_features_and_field_ids(tmp_path):
    path = tmp_path / "day_0.tsv"
    ints = [1, None, 5, -2] + [0] * 9
    cats = ["68fd1e64", None] + ["%08x" % i for i in range(24)]
    path.write_text(line(1, ints, cats) + line(0, [None] * 13, [None] * 26))
    dense, ids, labels = torch_ctr.read_criteo(str(path))
    assert labels.tolist() == [1.0, 0.0]
    assert dense.shape == (2, 13) and ids.shape == (2, 26, 1)  # one id per field
    ids = ids[:, :, 0]
    assert np.allclose(dense[0, :4], [np.log1p(1), 0.0, np.log1p(5), 0.0])
    assert (dense[1] == 0).all()
    raw = ids.view(np.uint64) & np.uint64((1 << 56) - 1)
    fields = ids.view(np.uint64) >> np.uint64(56)
    assert raw[0, 0] == 0x68FD1E64 + 1 and raw[0, 1] == 0  # missing: 0
    assert (raw[1] == 0).all()
    assert (fields == np.arange(26, dtype=np.uint64)).all()  # fields never collide


def test_refuses_a_line_with_the_wrong_column_count(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match="bad.tsv:1: 3 columns"):
        torch_ctr.read_criteo(str(path))


def test_trains_locally_on_a_file(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(3000):
        cats = ["%08x" % rng.integers(0, 50) for _ in range(26)]
        label = int(int(cats[0], 16) < 25)  # learnable from field 0
        lines.append(line(label, list(rng.integers(0, 100, 13)), cats))
    path = tmp_path / "train.tsv"
    path.write_text("".join(lines))
    history = torch_ctr.main(["--local", "--criteo", str(path), "--test", "500",
                              "--epochs", "3", "--batch", "64", "--local_rows", "4096",
                              "--emb_lr", "0.1", "--lr", "0.01"])
    assert len(history) == 3
    assert history[-1]["auc"] > 0.9, history


def test_multi_hot_bags_hold_one_to_k_ids_of_their_field():
    data = torch_ctr.Synthetic(multi_hot=3)
    dense, ids, labels, p = data.batch(2000, np.random.default_rng(1))
    assert ids.shape == (2000, 26, 3) and dense.shape == (2000, 13)
    present = ids >= 0
    sizes = present.sum(-1)
    assert sizes.min() == 1 and sizes.max() == 3
    assert (present[:, :, 0]).all(), "a bag's ids come first"
    fields = ids.view(np.uint64) >> np.uint64(56)
    assert (fields[present] == np.broadcast_to(np.arange(26)[:, None], ids.shape)[present]).all()
    assert ((0 < p) & (p < 1)).all() and set(np.unique(labels)) == {0.0, 1.0}
    flat, offsets = torch_ctr.bags(ids)
    assert len(offsets) == 2000 * 26 and len(flat) == sizes.sum()
    assert offsets[0] == 0 and (np.diff(offsets) == sizes.reshape(-1)[:-1]).all()
    assert (flat >= 0).all()
    # --multi_hot 1 is the single-id stream: bags of one id.
    _, single, _, _ = torch_ctr.Synthetic(multi_hot=1).batch(50, np.random.default_rng(2))
    assert single.shape == (50, 26, 1) and (single >= 0).all()


def test_multi_hot_trains_locally():
    history = torch_ctr.main(["--local", "--multi_hot", "3", "--epochs", "2", "--samples",
                              "20000", "--test", "5000", "--local_rows", "65536"])
    assert len(history) == 2
    # A model that learnt nothing scores 0.5 (measured: 0.689 after 2 epochs,
    # the teacher 0.827: a bag's ids are averaged, so each says less).
    assert history[-1]["auc"] > 0.6, history
