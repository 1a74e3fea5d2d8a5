// TableClient: a worker's calls on sparse embedding tables, over the
// channels of its PsClient. Each batch is deduplicated first (unique ids
// and an inverse index), so every shard is asked for a row once however
// often the batch names its id, and a push sums the gradients of repeated
// ids into one row gradient before sending. Ids go to the shard of their
// slot (sparse/id_hash.h: ShardOfId), or with replicated shards to the
// chain head of that replica group (retried there across a failover), all
// shards at once; every call has a
// deadline and is retried through the shard's channel (reconnects, backoff)
// with the same request, so a retried push carries the same (worker,
// worker_incarnation, sequence) and is applied at most once (sequences come
// from the PsClient's shard channels, so the TableClients of one PsClient
// never reuse one). A shard that
// lost a table (restarted without a checkpoint) has it registered again,
// with a warning: that shard's rows start over.
//
// A sync table (TableSpec.sync) takes, from every worker and every step,
// one training Lookup and then one Push, each sent to every shard in one
// request (empty where the batch has no ids of that shard): the shards
// apply a step when every worker's push is in, and a lookup waits (up to
// pull_timeout) until the step of the worker's last push is applied.
//
//   TableClient tables(client.get());
//   RETURN_IF_ERROR(tables.Register({spec}));
//   std::vector<float> rows(ids.size() * dim);
//   RETURN_IF_ERROR(tables.Lookup("user", ids, /*train=*/true, clock, rows.data()));
//   ...
//   RETURN_IF_ERROR(tables.Push("user", ids, grads.data(), clock));
//
// Thread-compatible: one batch at a time per TableClient.
#ifndef SHARDTRAIN_CLIENT_TABLE_CLIENT_H_
#define SHARDTRAIN_CLIENT_TABLE_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/ps_client.h"
#include "client/shard_channel.h"
#include "proto/shardtrain.pb.h"
#include "sparse/id_positions.h"

namespace shardtrain::client {

// What one Lookup or Push did.
struct TableCallStats {
  int64_t ids = 0;          // ids in the batch
  int64_t unique_ids = 0;   // after deduplication
  int64_t dropped = 0;      // Push: gradients of ids without a row
  int64_t duplicates = 0;   // Push: shards that had applied it already
};

class TableClient {
 public:
  // `client` is not owned and must outlive this.
  explicit TableClient(PsClient* client);

  // Registers tables on every shard (idempotent for identical specs).
  absl::Status Register(const std::vector<TableSpec>& tables);

  // The rows of ids (ids.size() * dim floats to out). train: find or create
  // rows (admission permitting) and mark them used at `clock`; otherwise
  // read only. NOT_FOUND for a table not registered through this client.
  absl::Status Lookup(const std::string& table, absl::Span<const uint64_t> ids, bool train,
                      int64_t clock, float* out, TableCallStats* stats = nullptr);

  // Pushes grads (ids.size() * dim floats, finite) for ids; gradients of a
  // repeated id are summed.
  absl::Status Push(const std::string& table, absl::Span<const uint64_t> ids,
                    const float* grads, int64_t clock, TableCallStats* stats = nullptr);

  // Rows and gradients of `table` travel as `dtype`: DTYPE_F32 (the
  // default), DTYPE_BF16 or DTYPE_F16, half the bytes (the shards store
  // f32; rows read are rounded to nearest even, gradients are rounded
  // before they are sent). NOT_FOUND for a table not registered here.
  absl::Status SetWireDType(const std::string& table, DType dtype);
  DType wire_dtype(const std::string& table) const;

  // A table's dim, or 0 when not registered through this client.
  int32_t dim(const std::string& table) const;

 private:
  // Ids per RPC: a shard's share of a batch goes in calls of at most this
  // many ids, all at once, so that the shard's table work on one overlaps
  // the transfer and copies of the others.
  static constexpr size_t kIdsPerCall = 16384;

  // One RPC's ids: indices into Batch::unique, all of one shard.
  struct Part {
    int shard = 0;
    std::vector<uint32_t> unique;
  };
  // The batch's unique ids in parts by shard.
  struct Batch {
    std::vector<uint32_t> inverse;  // ids[i] is unique[inverse[i]]
    std::vector<uint64_t> unique;
    std::vector<Part> parts;
  };
  // every_shard_once: one part per shard, empty where no id is its.
  void Dedup(absl::Span<const uint64_t> ids, bool every_shard_once, Batch* batch);
  using StartFn = std::function<void(size_t part, const ShardAttempt&,
                                     std::function<void(grpc::Status)>)>;
  // Runs call p of `parts` (start(p, ...)) on its shard's channel, routed
  // to the head of the shard's replica group when the shards are
  // replicated, all at once, each attempt given attempt_timeout, and waits
  // for all; the first error.
  absl::Status CallParts(const char* method, const std::vector<Part>& parts,
                         const StartFn& start, absl::Duration attempt_timeout);
  // A StartFn that sends requests[p], stamped with the attempt's chain
  // epoch, to the attempt's target with `method` (a ParameterServer async
  // stub method), or as a `frame_method` frame to its data port when it has
  // one (client/shard_channel.h), its answer into responses[p].
  template <typename Request, typename Response>
  StartFn Send(wire::DataMethod frame_method, void (ParameterServer::Stub::async::*method)(
                   grpc::ClientContext*, const Request*, Response*,
                   std::function<void(grpc::Status)>),
               std::vector<Request>& requests, std::vector<Response>& responses);
  // CallParts for a call on `table`; when a shard answers NOT_FOUND (it
  // lost the table), registers the tables again and runs the calls once
  // more (a push keeps its sequences, so no part is applied twice).
  absl::Status CallTable(const std::string& table, const char* method,
                         const std::vector<Part>& parts, const StartFn& start,
                         absl::Duration attempt_timeout);
  // Registers every table again after a shard answered NOT_FOUND for `table`.
  absl::Status Reregister(const std::string& table, const absl::Status& why);

  PsClient* const client_;
  // What a call needs of a table registered here.
  struct Registered {
    int32_t dim = 0;
    bool sync = false;
    DType wire = DTYPE_F32;
  };
  // NOT_FOUND for a table not registered here.
  absl::StatusOr<Registered*> Find(const std::string& table);

  std::vector<TableSpec> specs_;  // as first registered, to register again
  absl::flat_hash_map<std::string, Registered> tables_;
  sparse::IdPositions positions_;  // Dedup's, kept from batch to batch
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_TABLE_CLIENT_H_
