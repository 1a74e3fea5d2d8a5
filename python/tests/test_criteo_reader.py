"""examples/torch_ctr.py's reader of Criteo's display-advertising TSV
(label, 13 integer features, 26 hexadecimal categoricals, empty fields
allowed) on a file the test writes, and a short local run on it."""

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
    assert dense.shape == (2, 13) and ids.shape == (2, 26)
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
