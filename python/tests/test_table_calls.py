"""The client's table calls run on a thread of its own, in the order they
were made: lookup_async and push_sparse_async return at once, a started
lookup follows the pushes started before it, a dropped handle still runs
its call, close() runs what was started, and errors raise at wait(). Real
shards (conftest.start_shards)."""

import time

import numpy as np
import pytest

import shardtrain

DIM = 3
IDS = np.array([7, 2**63 + 5, 11], np.uint64)


def spec(name, **extra):
    return dict(name=name, dim=DIM, optimizer="sgd", learning_rate=1.0, init="INIT_ZEROS",
                **extra)


def rows_of(client, name, ids=IDS):
    out = np.empty((len(ids), DIM), np.float32)
    client.lookup(name, ids, out, train=False)
    return out


def test_started_calls_run_in_order(start_shards):
    cluster = start_shards(2)
    with shardtrain.Client(cluster.addresses, worker=0, num_workers=1) as c:
        c.register_tables([spec("t")])
        out = np.empty((len(IDS), DIM), np.float32)
        c.lookup("t", IDS, out, train=True, clock=0)
        grads = [np.full((len(IDS), DIM), k + 1, np.float32) for k in range(3)]
        calls = [c.push_sparse_async("t", IDS, g, clock=k + 1) for k, g in enumerate(grads)]
        # A handle dropped at once still runs its push, before the lookup.
        c.push_sparse_async("t", IDS, np.full((len(IDS), DIM), 10, np.float32), clock=4)
        looked = np.empty((len(IDS), DIM), np.float32)
        lookup = c.lookup_async("t", IDS, looked, train=False)
        assert isinstance(lookup, shardtrain.TableCall)
        stats = lookup.wait()
        assert stats["unique_ids"] == len(IDS)
        # Run in order: every push before the lookup is in the rows it read.
        assert all(call.done() for call in calls)
        assert [call.wait()["unique_ids"] for call in calls] == [len(IDS)] * 3
        np.testing.assert_array_equal(looked, np.full((len(IDS), DIM), -16, np.float32))


def test_a_started_lookup_waits_on_the_shards_without_blocking_the_caller(start_shards):
    # A sync table: worker 0's lookup of step 1 is parked on the shard until
    # worker 1's push of step 1 is in; lookup_async has returned long before.
    cluster = start_shards(1, num_workers=2)
    with shardtrain.Client(cluster.addresses, worker=0, num_workers=2) as w0, \
            shardtrain.Client(cluster.addresses, worker=1, num_workers=2) as w1:
        for w in (w0, w1):
            w.register_tables([spec("s", sync=True)])
            w.lookup("s", IDS, np.empty((len(IDS), DIM), np.float32), train=True, clock=0)
        push = w0.push_sparse_async("s", IDS, np.full((len(IDS), DIM), 1, np.float32), clock=1)
        out = np.zeros((len(IDS), DIM), np.float32)
        started = time.monotonic()
        lookup = w0.lookup_async("s", IDS, out, train=True, clock=1)
        assert time.monotonic() - started < 0.5
        time.sleep(0.5)
        assert not lookup.done()
        w1.push_sparse("s", IDS, np.full((len(IDS), DIM), 3, np.float32), clock=1)
        push.wait()
        lookup.wait()
        # The step's mean gradient, applied once: -(1 + 3) / 2.
        np.testing.assert_array_equal(out, np.full((len(IDS), DIM), -2, np.float32))


def test_close_runs_the_started_calls_and_later_ones_fail(start_shards):
    cluster = start_shards(2)
    c = shardtrain.Client(cluster.addresses, worker=0, num_workers=1)
    c.register_tables([spec("c")])
    c.lookup("c", IDS, np.empty((len(IDS), DIM), np.float32), train=True)  # makes the rows
    grads = np.full((len(IDS), DIM), 1, np.float32)
    for clock in (1, 2):
        c.push_sparse_async("c", IDS, grads, clock=clock)
    c.close()
    with shardtrain.Client(cluster.addresses, worker=0, num_workers=1) as again:
        again.register_tables([spec("c")])
        np.testing.assert_array_equal(rows_of(again, "c"),
                                      np.full((len(IDS), DIM), -2, np.float32))
    late = c.push_sparse_async("c", IDS, grads, clock=3)
    with pytest.raises(shardtrain.ShardtrainError) as error:
        late.wait()
    assert error.value.code == "FAILED_PRECONDITION"
    with pytest.raises(shardtrain.ShardtrainError) as error:
        rows_of(c, "c")
    assert error.value.code == "FAILED_PRECONDITION"


def test_bad_calls_raise_when_made(start_shards):
    cluster = start_shards(1)
    with shardtrain.Client(cluster.addresses, worker=0, num_workers=1) as c:
        c.register_tables([spec("b")])
        out = np.empty((len(IDS), DIM), np.float32)
        with pytest.raises(ValueError, match="not registered"):
            c.lookup_async("nope", IDS, out)
        with pytest.raises(ValueError, match="NaN or Inf"):
            c.push_sparse_async("b", IDS, np.full((len(IDS), DIM), np.inf, np.float32))
        with pytest.raises(ValueError):
            c.lookup_async("b", IDS, np.empty((1, DIM), np.float32))  # out too small
        # Nothing was sent: the rows are still unstored.
        assert sum(t["rows"] for s in c.status() for t in s["tables"] if t["name"] == "b") == 0


def test_a_large_answer_arrives_row_for_row(start_shards):
    # 40k rows of 12 bytes (in calls of up to 16k ids per shard, each answer
    # many network reads): each row is its id's, as read 50 at a time.
    cluster = start_shards(2)
    with shardtrain.Client(cluster.addresses, worker=0, num_workers=1) as c:
        c.register_tables([dict(name="big", dim=DIM, optimizer="sgd", learning_rate=0.1,
                                init="INIT_NORMAL", init_scale=1.0,
                                seed=3)])
        ids = np.random.default_rng(5).integers(0, 2**63, 40_000, dtype=np.uint64)
        whole = np.empty((len(ids), DIM), np.float32)
        c.lookup("big", ids, whole, train=False)
        for start in range(0, len(ids), 5000):
            chunk = ids[start:start + 5000]
            small = np.empty((len(chunk), DIM), np.float32)
            for i in range(0, len(chunk), 50):
                c.lookup("big", chunk[i:i + 50], small[i:i + 50], train=False)
            np.testing.assert_array_equal(whole[start:start + 5000], small)
