"""Where this process sits in a shardtrain job, read from its environment.

`shardtrain-run` starts every worker with these variables set; a worker
started by hand (or by another launcher) sets them itself:

  SHARDTRAIN_SERVERS        shard addresses host:port, comma-separated, in
                            shard-index order (required for a distributed run;
                            unset or empty: a plain local run)
  SHARDTRAIN_WORKER         this worker's index in [0, SHARDTRAIN_NUM_WORKERS)
                            (default 0)
  SHARDTRAIN_NUM_WORKERS    workers in the job (default 1)
  SHARDTRAIN_MODE           sync | async; must match the shards' --mode
                            (default async)

Optional, with the meaning of ps-worker's flags of the same name:

  SHARDTRAIN_WIRE_DTYPE     f32 | f16 | bf16: gradients and parameters on the
                            wire (default f32)
  SHARDTRAIN_TOPK_RATIO     in [0, 1]: send the top ratio of each gradient
                            partition with error feedback; 0 sends all
                            (default 0)
  SHARDTRAIN_TLS_CA         PEM file of the CA that signed the shards'
                            certificates (turns TLS on)
  SHARDTRAIN_TLS_CERT       PEM client certificate, for mutual TLS
  SHARDTRAIN_TLS_KEY        PEM private key of SHARDTRAIN_TLS_CERT
  SHARDTRAIN_TOKEN_FILE     file holding the shared auth token (needs TLS)
  SHARDTRAIN_TOKEN          the token itself (instead of the file)
  SHARDTRAIN_MAX_PARTITION_ELEMENTS  must match the shards'
                            --max_partition_elements (default: ps-server's);
                            shardtrain-run sets it from that flag
  SHARDTRAIN_METRICS_PORT   Prometheus port of the worker's metrics; 0 picks a
                            free one, -1 (default) serves none
  SHARDTRAIN_REPLICAS       copies of every partition (default 1)
  SHARDTRAIN_ETCD_ENDPOINTS with SHARDTRAIN_REPLICAS > 1: etcd host:port,...
  SHARDTRAIN_ETCD_CA        PEM file of the CA that signed etcd's certificate
                            (an etcd that serves https)
  SHARDTRAIN_ETCD_CERT      PEM client certificate etcd trusts (its
                            --client-cert-auth)
  SHARDTRAIN_ETCD_KEY       PEM private key of SHARDTRAIN_ETCD_CERT
  SHARDTRAIN_JOB            the job's namespace in etcd (default shardtrain)

Nothing here imports torch or the compiled extension, so a launcher or a
data pipeline may use it freely. A malformed value raises ValueError naming
the variable.

Example:
    from shardtrain import env
    settings = env.from_environ()
    if settings.distributed:
        sampler = DistributedSampler(dataset, **env.sampler_args())
    print(f"worker {env.rank()} of {env.world_size()}")
"""

import dataclasses
import os
from typing import Mapping, Optional

SERVERS = "SHARDTRAIN_SERVERS"
WORKER = "SHARDTRAIN_WORKER"
NUM_WORKERS = "SHARDTRAIN_NUM_WORKERS"
MODE = "SHARDTRAIN_MODE"
WIRE_DTYPE = "SHARDTRAIN_WIRE_DTYPE"
TOPK_RATIO = "SHARDTRAIN_TOPK_RATIO"
TLS_CA = "SHARDTRAIN_TLS_CA"
TLS_CERT = "SHARDTRAIN_TLS_CERT"
TLS_KEY = "SHARDTRAIN_TLS_KEY"
TOKEN_FILE = "SHARDTRAIN_TOKEN_FILE"
TOKEN = "SHARDTRAIN_TOKEN"
MAX_PARTITION_ELEMENTS = "SHARDTRAIN_MAX_PARTITION_ELEMENTS"
METRICS_PORT = "SHARDTRAIN_METRICS_PORT"
REPLICAS = "SHARDTRAIN_REPLICAS"
ETCD_ENDPOINTS = "SHARDTRAIN_ETCD_ENDPOINTS"
ETCD_CA = "SHARDTRAIN_ETCD_CA"
ETCD_CERT = "SHARDTRAIN_ETCD_CERT"
ETCD_KEY = "SHARDTRAIN_ETCD_KEY"
JOB = "SHARDTRAIN_JOB"

_MODES = ("sync", "async")
_WIRE_DTYPES = ("f32", "f16", "bf16")


@dataclasses.dataclass(frozen=True)
class Settings:
    """One worker's view of its job. Immutable; safe to share."""

    servers: tuple = ()  # "host:port" per shard, in shard-index order
    worker: int = 0
    num_workers: int = 1
    mode: str = "async"
    wire_dtype: str = "f32"
    topk_ratio: float = 0.0
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    token: str = ""
    token_file: str = ""
    max_partition_elements: int = 0  # 0: the client's default (ps-server's)
    metrics_port: int = -1
    replicas: int = 1
    etcd_endpoints: str = ""
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    job: str = "shardtrain"

    @property
    def distributed(self) -> bool:
        """Whether there are shards to train with (else: a local run)."""
        return bool(self.servers)

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    def client_kwargs(self) -> dict:
        """Keyword arguments of shardtrain.Client for these settings."""
        kwargs = dict(
            servers=list(self.servers),
            worker=self.worker,
            num_workers=self.num_workers,
            sync=self.sync,
            wire_dtype=self.wire_dtype,
            topk_ratio=self.topk_ratio,
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            token=self.token,
            replicas=self.replicas,
            etcd_endpoints=self.etcd_endpoints,
            etcd_ca=self.etcd_ca,
            etcd_cert=self.etcd_cert,
            etcd_key=self.etcd_key,
            job=self.job,
            metrics_port=self.metrics_port,
            token_file=self.token_file,
        )
        if self.max_partition_elements > 0:
            kwargs["max_partition_elements"] = self.max_partition_elements
        return kwargs


def _int(environ: Mapping[str, str], name: str, default: int, low: int,
         high: Optional[int] = None) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}={value} is out of range (want {bound})")
    return value


def _choice(environ: Mapping[str, str], name: str, default: str, choices) -> str:
    value = environ.get(name, "").strip() or default
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def _servers(environ: Mapping[str, str]) -> tuple:
    text = environ.get(SERVERS, "").strip()
    if not text:
        return ()
    servers = tuple(s.strip() for s in text.split(","))
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{SERVERS}={text!r}: {server!r} is not host:port "
                "(want host:port,host:port,... in shard order)")
    return servers


def from_environ(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Reads the SHARDTRAIN_* variables of `environ` (default os.environ)."""
    environ = os.environ if environ is None else environ
    num_workers = _int(environ, NUM_WORKERS, 1, 1)
    worker = _int(environ, WORKER, 0, 0)
    if worker >= num_workers:
        raise ValueError(
            f"{WORKER}={worker} is not in [0, {NUM_WORKERS}={num_workers})")
    topk_text = environ.get(TOPK_RATIO, "").strip()
    topk = 0.0
    if topk_text:
        try:
            topk = float(topk_text)
        except ValueError:
            raise ValueError(f"{TOPK_RATIO}={topk_text!r} is not a number") from None
        if not 0.0 <= topk <= 1.0:
            raise ValueError(f"{TOPK_RATIO}={topk} is not in [0, 1]")
    token = environ.get(TOKEN, "")
    token_file = environ.get(TOKEN_FILE, "")
    if token and token_file:
        raise ValueError(f"set {TOKEN} or {TOKEN_FILE}, not both")
    tls = {name: environ.get(name, "") for name in (TLS_CA, TLS_CERT, TLS_KEY)}
    if bool(tls[TLS_CERT]) != bool(tls[TLS_KEY]):
        raise ValueError(f"set both {TLS_CERT} and {TLS_KEY}, or neither")
    if tls[TLS_CERT] and not tls[TLS_CA]:
        raise ValueError(f"{TLS_CERT} needs {TLS_CA} (mutual TLS runs over TLS)")
    etcd = {name: environ.get(name, "") for name in (ETCD_CA, ETCD_CERT, ETCD_KEY)}
    if bool(etcd[ETCD_CERT]) != bool(etcd[ETCD_KEY]):
        raise ValueError(f"set both {ETCD_CERT} and {ETCD_KEY}, or neither")
    if etcd[ETCD_CERT] and not etcd[ETCD_CA]:
        raise ValueError(f"{ETCD_CERT} needs {ETCD_CA} (client certificates go over TLS)")
    return Settings(
        servers=_servers(environ),
        worker=worker,
        num_workers=num_workers,
        mode=_choice(environ, MODE, "async", _MODES),
        wire_dtype=_choice(environ, WIRE_DTYPE, "f32", _WIRE_DTYPES),
        topk_ratio=topk,
        tls_ca=tls[TLS_CA],
        tls_cert=tls[TLS_CERT],
        tls_key=tls[TLS_KEY],
        token=token,
        token_file=token_file,
        max_partition_elements=_int(environ, MAX_PARTITION_ELEMENTS, 0, 1),
        metrics_port=_int(environ, METRICS_PORT, -1, -1, 65535),
        replicas=_int(environ, REPLICAS, 1, 1, 3),
        etcd_endpoints=environ.get(ETCD_ENDPOINTS, ""),
        etcd_ca=etcd[ETCD_CA],
        etcd_cert=etcd[ETCD_CERT],
        etcd_key=etcd[ETCD_KEY],
        job=environ.get(JOB, "") or "shardtrain",
    )


def rank() -> int:
    """This worker's index (0 outside a shardtrain job)."""
    return from_environ().worker


def world_size() -> int:
    """The job's worker count (1 outside a shardtrain job)."""
    return from_environ().num_workers


def is_chief() -> bool:
    """Whether this worker evaluates and reports (worker 0, as ps-worker)."""
    return rank() == 0


def sampler_args() -> dict:
    """num_replicas and rank for torch.utils.data.DistributedSampler, so
    each worker trains on its own disjoint share of the data."""
    settings = from_environ()
    return dict(num_replicas=settings.num_workers, rank=settings.worker)
