// PullReader: how a shard answers a pull of its dense partitions, apart from
// gRPC and from waiting (server/parameter_server_service.h parks the pulls that must wait):
//
//   RETURN_IF_ERROR(reader.Validate(request));  // nothing allocated yet
//   if (reader.Ready(request)) reader.Fill(request, &builder, &versions);
//   // replicated: answer only once reader.Committed(request, versions)
//
//  - Validate checks the request in full (worker, incarnation, sizes, dtype,
//    keys, a version at most one step ahead (or, before a sync PushPull's
//    push, at most that push's step), the response's size) and
//    counts a refusal over a limit;
//  - Ready: every partition has reached min_version and, in async mode with
//    a staleness bound, this worker is not too far ahead of the slowest
//    live one (SSP);
//  - Fill writes each partition's parameters, converted to the requested
//    dtype, under its lock straight into the memory that is sent;
//  - Committed (replicated shards): the chain's tail holds every version
//    Fill wrote, so the answer shows no update a failover could lose.
//
// Reads the store and membership only; thread-safe.
#ifndef SHARDTRAIN_SERVER_PULL_READER_H_
#define SHARDTRAIN_SERVER_PULL_READER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"
#include "server/membership.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "server/tensor_store.h"
#include "wire/message_encoder.h"

namespace shardtrain::server {

class PullReader {
 public:
  // None owned; all must outlive the reader. `incarnation`: the shard's.
  PullReader(const ShardOptions& options, uint64_t incarnation, const TensorStore* store,
             const Membership* membership, ShardMetrics* metrics);

  // OK when `request` may be answered (now or once Ready); nothing changes
  // but the refusal counters. `push_clock`: the request is a sync
  // PushPull's pull half, checked before its push for step `push_clock` is
  // applied; that push brings a partition behind its step (its shard
  // restored an older checkpoint) up to push_clock - 1, so min_version may
  // be up to push_clock. Checked again as the pull begins, after the push.
  absl::Status Validate(const PullRequest& request, int64_t push_clock = 0) const;
  // True when `request` may be answered now. REQUIRES: Validate(request).ok().
  bool Ready(const PullRequest& request) const;
  // The SSP part of Ready, which a table's training lookup obeys too: false
  // when, in async mode with a staleness bound, `worker` at `clock` is more
  // than --max_staleness steps ahead of the slowest live worker.
  bool WithinStaleness(uint32_t worker, int64_t clock) const;
  // Writes every requested partition once into `builder`; `versions` (if
  // not null) gets the version written of each part, in request order.
  // REQUIRES: Validate(request).ok().
  void Fill(const PullRequest& request, wire::PullResponseBuilder* builder,
            std::vector<int64_t>* versions = nullptr) const;
  // The same as a stock message (tests, in-process callers): encoded as
  // above and parsed back, wait_seconds 0.
  void Fill(const PullRequest& request, PullResponse* response) const;
  // True when every part is committed at least up to the version Fill
  // wrote of it (`versions`). REQUIRES: Validate(request).ok().
  bool Committed(const PullRequest& request, absl::Span<const int64_t> versions) const;

 private:
  const ShardOptions& options_;
  const uint64_t incarnation_;
  const TensorStore* const store_;
  const Membership* const membership_;
  ShardMetrics* const metrics_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PULL_READER_H_
