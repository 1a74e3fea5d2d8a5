"""The shardtrain extension against real shards: a correct round trip, and
misuse that must raise a clear Python exception and change nothing on the
shards."""

import socket
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

import shardtrain

PARTITION = 64  # elements per partition: "w" spans 10 partitions on 2 shards
LR = 0.5
SHAPES = {"w": (20, 30), "b": (30,)}


def values_of(name):
    """Initial values exactly representable, as are their SGD updates below."""
    n = int(np.prod(SHAPES[name]))
    offset = 7 if name == "b" else 0
    return (((np.arange(n) + offset) % 37 - 18) * 0.25).astype(np.float32).reshape(SHAPES[name])


def grad_of(name, step):
    n = int(np.prod(SHAPES[name]))
    return (((np.arange(n) + step) % 5 - 2) * 0.5).astype(np.float32).reshape(SHAPES[name])


def zeros():
    return [np.zeros(SHAPES[name], np.float32) for name in SHAPES]


@pytest.fixture
def cluster(start_shards):
    return start_shards(2, [f"--max_partition_elements={PARTITION}", f"--lr={LR}",
                            "--optimizer=sgd"], num_workers=2)


def connect(cluster, worker=0, **kwargs):
    kwargs.setdefault("reconnect_timeout", 10.0)
    return shardtrain.Client(cluster.addresses, worker, 2,
                             max_partition_elements=PARTITION, **kwargs)


@pytest.fixture
def registered(cluster):
    """Worker 0, registered with its own values for "w" and an Init for "b"."""
    client = connect(cluster)
    client.register([("w", SHAPES["w"], values_of("w")),
                     ("b", SHAPES["b"], shardtrain.Init("constant", scale=1.5))])
    yield client
    client.close()


def server_state(client):
    """What the shards hold: their update counts, partition versions and
    the parameters."""
    shards = client.status()
    params = zeros()
    client.pull(0, 0, params)
    return ([(s["updates_applied"], s["num_tensors"],
              [(p["tensor"], p["partition"], p["version"]) for p in s["partitions"]])
             for s in shards], [p.copy() for p in params])


def assert_unchanged(client, before):
    after = server_state(client)
    assert after[0] == before[0]
    for a, b in zip(after[1], before[1]):
        np.testing.assert_array_equal(a, b)


def test_round_trip(cluster):
    # Worker 1 registers first: it waits for worker 0's values.
    worker1 = connect(cluster, worker=1)
    waiting = {}

    def register_worker1():
        try:
            worker1.register([("w", SHAPES["w"], np.full(SHAPES["w"], 9.0, np.float32)),
                              ("b", SHAPES["b"], shardtrain.Init("constant", scale=1.5))])
            waiting["done"] = time.monotonic()
        except Exception as error:  # reported below
            waiting["error"] = error

    thread = threading.Thread(target=register_worker1)
    thread.start()
    time.sleep(0.5)
    assert not waiting, "worker 1 registered before worker 0 sent the values"
    worker0 = connect(cluster, worker=0)
    worker0.register([("w", SHAPES["w"], values_of("w")),
                      ("b", SHAPES["b"], shardtrain.Init("constant", scale=1.5))])
    thread.join(timeout=20)
    assert not thread.is_alive() and "error" not in waiting, waiting

    expected = [values_of("w"), np.full(SHAPES["b"], 1.5, np.float32)]
    for client in (worker0, worker1):
        params = zeros()
        stats = client.pull(0, 0, params)
        assert stats["min_version"] == 0
        for got, want in zip(params, expected):
            np.testing.assert_array_equal(got, want)
    assert worker0.known_versions == (0, 0)

    # One SGD step: exactly values - lr * grad.
    grads = [grad_of(name, 1) for name in SHAPES]
    assert worker0.push(1, grads) == {"max_staleness": 0}
    params = zeros()
    assert worker0.pull(1, 0, params)["min_version"] == 1
    expected = [want - np.float32(LR) * g for want, g in zip(expected, grads)]
    for got, want in zip(params, expected):
        np.testing.assert_array_equal(got, want)

    # The same through the overlapped exchange, tensor by tensor.
    grads = [grad_of(name, 2) for name in SHAPES]
    for t in reversed(range(len(SHAPES))):
        worker0.start_exchange(t, 2, 0, grads[t], params[t])
    stats = worker0.finish_exchanges()
    assert stats["min_version"] == 2 and stats["max_staleness"] == 0
    expected = [want - np.float32(LR) * g for want, g in zip(expected, grads)]
    for got, want in zip(params, expected):
        np.testing.assert_array_equal(got, want)

    # push_pull: the answer includes the push.
    grads = [grad_of(name, 3) for name in SHAPES]
    stats = worker0.push_pull(3, 0, grads, params)
    assert stats["min_version"] == 3
    expected = [want - np.float32(LR) * g for want, g in zip(expected, grads)]
    for got, want in zip(params, expected):
        np.testing.assert_array_equal(got, want)
    assert worker0.known_versions == (3, 3)

    shards = worker0.status()
    assert [s["shard"] for s in shards] == [0, 1]
    assert sum(s["num_partitions"] for s in shards) == 10 + 1
    beat = worker0.heartbeat(3)
    assert [w["worker"] for w in beat["workers"]] == [0, 1]
    assert beat["workers"][0]["clock"] == 3
    worker0.close()
    worker1.close()
    assert worker0.closed


def test_bad_buffers_raise_and_change_nothing(registered):
    client = registered
    before = server_state(client)
    good = [grad_of(name, 1) for name in SHAPES]

    cases = [
        # (grads, exception, words the message must contain)
        ([good[0], np.zeros(29, np.float32)], ValueError, ["gradient of b", "29", "30"]),
        ([good[0].astype(np.float64), good[1]], TypeError, ["gradient of w", "float32"]),
        ([good[0].astype(np.int32), good[1]], TypeError, ["gradient of w", "float32"]),
        ([good[0].tolist(), good[1]], TypeError, ["gradient of w", "list"]),
        ([np.zeros((30, 40), np.float32)[:, ::2][:20], good[1]], ValueError,
         ["gradient of w", "C-contiguous"]),
        ([np.ascontiguousarray(good[0].T).T, good[1]], ValueError,
         ["gradient of w", "C-contiguous"]),
        ([good[0]], ValueError, ["1 buffers", "2 tensors"]),
        (good[0], ValueError, ["20 buffers", "2 tensors"]),
        ("w", TypeError, ["list of float32 buffers"]),
    ]
    for grads, error, words in cases:
        with pytest.raises(error) as raised:
            client.push(1, grads)
        for word in words:
            assert word in str(raised.value), (word, str(raised.value))
        with pytest.raises(error):
            client.push_pull(1, 0, grads, zeros())
    assert_unchanged(client, before)

    read_only = zeros()
    read_only[1].setflags(write=False)
    with pytest.raises(ValueError, match="parameters of b is read-only"):
        client.pull(0, 0, read_only)
    frozen = memoryview(bytes(4 * 600)).cast("f")
    with pytest.raises(ValueError, match="parameters of w is read-only"):
        client.pull(0, 0, [frozen, zeros()[1]])
    with pytest.raises(ValueError, match="parameters of w is read-only"):
        client.start_exchange(0, 1, 0, good[0], frozen)
    # The gradient is read while the parameters are written: not the same memory.
    shared = zeros()
    with pytest.raises(ValueError, match="share memory"):
        client.push_pull(1, 0, shared, shared)
    with pytest.raises(ValueError, match="share memory"):
        client.start_exchange(0, 1, 0, shared[0], shared[0])
    with pytest.raises(IndexError, match="tensor 2"):
        client.start_exchange(2, 1, 0, good[0], zeros()[0])
    assert_unchanged(client, before)


def test_bad_registrations_raise_and_register_nothing(cluster):
    client = connect(cluster)
    bad = [
        ([("w", (20, 30), np.zeros(599, np.float32))], ValueError,
         "initial values of w has 599 elements"),
        ([("w", (20, 30), np.zeros((20, 30), np.float64))], TypeError,
         "initial values of w must hold float32"),
        ([("w", (20, 0), shardtrain.Init())], ValueError, "dimension 0"),
        ([("w", (), shardtrain.Init())], ValueError, "shape is empty"),
        ([("w", "20x30", shardtrain.Init())], TypeError, "shape must be a tuple"),
        ([("w", (20, 30))], TypeError, r"\(name, shape, init\)"),
        ([(3, (20, 30), shardtrain.Init())], TypeError, "names are strings"),
        ([("w", (20, 30), "zeros")], TypeError, "must be a float32 buffer"),
        ([], ValueError, "at least one tensor"),
    ]
    for tensors, error, message in bad:
        with pytest.raises(error, match=message):
            client.register(tensors)
    with pytest.raises(ValueError, match="unknown initializer 'xavier'"):
        shardtrain.Init("xavier")

    # Checked by the shards: non-finite values from worker 0.
    values = values_of("w")
    values[3, 4] = np.nan
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        client.register([("w", SHAPES["w"], values)])
    assert raised.value.code == "INVALID_ARGUMENT"
    assert "initial value 94 is nan" in raised.value.message
    assert isinstance(raised.value, RuntimeError)
    assert all(s["num_tensors"] == 0 for s in client.status())

    # Nothing was registered, so nothing may be pushed yet.
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        client.push(1, [grad_of("w", 1)])
    assert raised.value.code == "FAILED_PRECONDITION"
    assert "register() first" in raised.value.message
    client.close()


def test_exchange_misuse_and_held_references(registered):
    client = registered
    grad = grad_of("w", 1)
    params = np.zeros(SHAPES["w"], np.float32)
    refs = (sys.getrefcount(grad), sys.getrefcount(params))
    client.start_exchange(0, 1, 0, grad, params)
    # The extension holds both buffers until finish_exchanges.
    assert sys.getrefcount(grad) > refs[0] and sys.getrefcount(params) > refs[1]
    with pytest.raises(ValueError, match="w is already being exchanged"):
        client.start_exchange(0, 1, 0, grad, np.zeros(SHAPES["w"], np.float32))
    for call in (lambda: client.push(1, [grad, grad_of("b", 1)]),
                 lambda: client.pull(1, 0, zeros())):
        with pytest.raises(shardtrain.ShardtrainError) as raised:
            call()
        assert raised.value.code == "FAILED_PRECONDITION"
        assert "finish_exchanges() first" in raised.value.message
    client.finish_exchanges()
    assert (sys.getrefcount(grad), sys.getrefcount(params)) == refs
    np.testing.assert_array_equal(params, values_of("w") - np.float32(LR) * grad)

    # Buffers handed over and then dropped by the caller stay alive.
    client.start_exchange(1, 2, 0, grad_of("b", 2), np.zeros(SHAPES["b"], np.float32))
    client.finish_exchanges()
    client.close()
    with pytest.raises(shardtrain.ShardtrainError, match="closed"):
        client.pull(2, 0, zeros())
    client.close()  # again: nothing happens


def test_unreachable_server_fails_within_the_reconnect_timeout():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    client = shardtrain.Client([f"127.0.0.1:{port}"], 0, 1, reconnect_timeout=1.5)
    start = time.monotonic()
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        client.register([("w", (4,), shardtrain.Init())])
    assert time.monotonic() - start < 10
    assert raised.value.code == "UNAVAILABLE"
    assert f"127.0.0.1:{port}" in raised.value.message
    with pytest.raises(shardtrain.ShardtrainError):
        client.status()


def test_wrong_token_is_refused_and_changes_nothing(start_shards, certs):
    # The data port serves TLS with the same token: the pull below goes there.
    cluster = start_shards(1, [f"--tls_cert={certs / 'server.pem'}",
                               f"--tls_key={certs / 'server.key'}",
                               f"--auth_token_file={certs / 'token'}",
                               "--data_listen=127.0.0.1:0"])
    token = (certs / "token").read_text().strip()
    tls = {"tls_ca": str(certs / "ca.pem"), "reconnect_timeout": 5.0}
    wrong = shardtrain.Client(cluster.addresses, 0, 1, token="not-the-token", **tls)
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        wrong.register([("w", (4,), np.ones(4, np.float32))])
    assert raised.value.code == "UNAUTHENTICATED"
    assert "wrong auth token" in raised.value.message
    no_token = shardtrain.Client(cluster.addresses, 0, 1, **tls)
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        no_token.status()
    assert raised.value.code == "UNAUTHENTICATED"

    right = shardtrain.Client(cluster.addresses, 0, 1, token=token, **tls)
    assert right.status()[0]["num_tensors"] == 0
    right.register([("w", (4,), np.ones(4, np.float32))])
    params = [np.zeros(4, np.float32)]
    right.pull(0, 0, params)
    np.testing.assert_array_equal(params[0], np.ones(4, np.float32))
    by_file = shardtrain.Client(cluster.addresses, 0, 1, token_file=str(certs / "token"), **tls)
    assert by_file.status()[0]["num_tensors"] == 1

    # A token never travels in plaintext; a missing CA file is named.
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        shardtrain.Client(cluster.addresses, 0, 1, token=token)
    assert raised.value.code == "INVALID_ARGUMENT"
    with pytest.raises(shardtrain.ShardtrainError) as raised:
        shardtrain.Client(cluster.addresses, 0, 1, tls_ca=str(certs / "missing.pem"))
    assert raised.value.code == "NOT_FOUND" and "missing.pem" in raised.value.message


def test_bad_settings_raise_value_errors():
    for kwargs, message in [({"wire_dtype": "f64"}, "wire_dtype"),
                            ({"topk_ratio": 1.5}, "topk_ratio"),
                            ({"rpc_timeout": 0.0}, "rpc_timeout"),
                            ({"reconnect_timeout": float("nan")}, "reconnect_timeout"),
                            ({"metrics_port": 70000}, "metrics_port"),
                            ({"etcd_cert": "c.pem", "etcd_key": "c.key"}, "--etcd_ca"),
                            ({"etcd_ca": "ca.pem", "etcd_cert": "c.pem"},
                             "--etcd_cert and --etcd_key")]:
        with pytest.raises(ValueError, match=message):
            shardtrain.Client(["127.0.0.1:1"], 0, 1, **kwargs)
    with pytest.raises(ValueError, match="worker must be in"):
        shardtrain.Client(["127.0.0.1:1"], 2, 2)
    with pytest.raises(ValueError, match="servers is empty"):
        shardtrain.Client([], 0, 1)


def test_gil_is_released_while_a_pull_waits(start_shards):
    # Sync: worker 0's pull of step 1 waits for worker 1's gradient, which
    # a Python thread sends meanwhile; it could not while the GIL was held.
    cluster = start_shards(1, ["--mode=sync", f"--lr={LR}"], num_workers=2)
    clients = [shardtrain.Client(cluster.addresses, w, 2, sync=True, pull_timeout=20.0)
               for w in range(2)]
    for client in clients:
        client.register([("w", (8,), shardtrain.Init("constant", scale=1.0))])
    ones = np.ones(8, np.float32)
    clients[0].push(1, [ones])

    def late_push():
        time.sleep(0.5)
        clients[1].push(1, [3 * ones])

    thread = threading.Thread(target=late_push)
    thread.start()
    params = [np.zeros(8, np.float32)]
    start = time.monotonic()
    stats = clients[0].pull(1, 1, params)
    thread.join(timeout=10)
    assert time.monotonic() - start < 10
    assert stats["server_wait_seconds"] > 0.2
    np.testing.assert_array_equal(params[0], np.full(8, 1.0 - LR * 2.0, np.float32))


def test_metrics_use_ps_workers_families(registered, cluster):
    client = connect(cluster, metrics_port=0)
    assert client.metrics_port > 0
    assert registered.metrics_port == -1
    client.register([("w", SHAPES["w"], values_of("w")),
                     ("b", SHAPES["b"], shardtrain.Init("constant", scale=1.5))])
    client.pull(0, 0, zeros())
    client.record_step(0.01, 0.002, 0.003, 0.0005, 0.02, 64, 1.25, 1)
    client.record_epoch(1, 0.75, 1000.0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{client.metrics_port}/metrics",
                                  timeout=10).read().decode()
    # (Fault families such as shardtrain_worker_rpc_retries_total have no
    # series until something is retried.)
    for family in ["shardtrain_rpc_requests_total", "shardtrain_rpc_duration_seconds",
                   "shardtrain_worker_phase_seconds",
                   "shardtrain_worker_steps_total", "shardtrain_worker_test_accuracy"]:
        assert family in text, family
    assert 'shardtrain_worker_loss 1.25' in text
    assert 'shardtrain_worker_test_accuracy 0.75' in text
    assert 'method="Register"' in text and 'method="Pull"' in text
    with pytest.raises(ValueError, match="samples"):
        client.record_step(0, 0, 0, 0, 0, -1, 0, 0)
    client.close()


def test_torch_tensors_are_used_in_place(registered):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    params = [torch.zeros(SHAPES["w"]), torch.zeros(SHAPES["b"])]
    registered.pull(0, 0, params)
    assert torch.equal(params[0], torch.from_numpy(values_of("w")))
    with pytest.raises(TypeError, match="parameters of w must hold float32"):
        registered.pull(0, 0, [torch.zeros(SHAPES["w"], dtype=torch.float64), params[1]])
    with pytest.raises(ValueError, match="parameters of w is not C-contiguous"):
        registered.pull(0, 0, [torch.zeros(SHAPES["w"][::-1]).t(), params[1]])
