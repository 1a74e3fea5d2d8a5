"""shardtrain: train with a sharded parameter server.

Client connects a worker to the shards (push gradients, pull parameters,
overlapped exchanges, sparse-table lookups and pushes; TableCall is the
handle of one started with lookup_async or push_sparse_async); Init names an initialiser the shards compute;
ShardtrainError is raised for errors from the shards or the network, with
.code (e.g. "UNAVAILABLE") and .message. shardtrain.torch (imported
separately) drives a PyTorch model with it.
"""

from shardtrain._core import Client, Init, ShardtrainError, TableCall, __version__

__all__ = ["Client", "Init", "ShardtrainError", "TableCall", "__version__"]
