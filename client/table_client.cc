#include "client/table_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <glog/logging.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "client/shard_channel.h"
#include "common/grpc_status.h"
#include "common/rpc_metrics.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "sparse/id_hash.h"
#include "sparse/id_positions.h"

namespace shardtrain::client {
namespace {

std::string IdBytes(const std::vector<uint64_t>& unique, const std::vector<uint32_t>& which) {
  std::string bytes(which.size() * sizeof(uint64_t), '\0');
  char* out = bytes.data();
  for (uint32_t u : which) {
    std::memcpy(out, &unique[u], sizeof(uint64_t));
    out += sizeof(uint64_t);
  }
  return bytes;
}

}  // namespace

TableClient::TableClient(PsClient* client) : client_(client) {}

absl::StatusOr<TableClient::Registered*> TableClient::Find(const std::string& table) {
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table \"", table, "\" is not registered"));
  }
  return &it->second;
}

absl::Status TableClient::SetWireDType(const std::string& table, DType dtype) {
  ASSIGN_OR_RETURN(Registered * registered, Find(table));
  if (common::DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table \"", table, "\": wire dtype ", common::DTypeName(dtype),
        " is not one of f32, bf16, f16"));
  }
  registered->wire = dtype;
  return absl::OkStatus();
}

DType TableClient::wire_dtype(const std::string& table) const {
  auto it = tables_.find(table);
  return it == tables_.end() ? DTYPE_F32 : it->second.wire;
}

int32_t TableClient::dim(const std::string& table) const {
  auto it = tables_.find(table);
  return it == tables_.end() ? 0 : it->second.dim;
}

absl::Status TableClient::CallParts(const char* method, const std::vector<Part>& parts,
                                    const StartFn& start, absl::Duration attempt_timeout) {
  const size_t n = parts.size();
  std::vector<absl::Status> statuses(n);
  absl::BlockingCounter pending(static_cast<int>(n));
  for (size_t p = 0; p < n; ++p) {
    ShardRpc rpc;
    rpc.method = method;
    // To the head of the part's group when the shards are replicated.
    rpc.role = ChainRole::kHead;
    rpc.attempt_timeout = attempt_timeout;
    rpc.reconnect_timeout = client_->options().reconnect_timeout;
    rpc.start = [&start, p, method, this](const ShardAttempt& attempt,
                                           std::function<void(grpc::Status)> done) {
      const absl::Time begin = absl::Now();
      start(p, attempt,
            [this, method, begin, done = std::move(done)](grpc::Status status) {
              if (client_->rpc_metrics() != nullptr) {
                client_->rpc_metrics()->Record(method, status.error_code(), 0, 0,
                                               absl::ToDoubleSeconds(absl::Now() - begin));
              }
              done(std::move(status));
            });
    };
    client_->channel(parts[p].shard)
        ->Call(std::move(rpc), [&statuses, &pending, p](absl::Status status) {
          statuses[p] = std::move(status);
          pending.DecrementCount();
        });
  }
  pending.Wait();
  for (absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

template <typename Request, typename Response>
TableClient::StartFn TableClient::Send(
    wire::DataMethod frame_method,
    void (ParameterServer::Stub::async::*method)(grpc::ClientContext*, const Request*,
                                                 Response*, std::function<void(grpc::Status)>),
    std::vector<Request>& requests, std::vector<Response>& responses) {
  return [frame_method, method, &requests, &responses](size_t p, const ShardAttempt& attempt,
                                                       std::function<void(grpc::Status)> done) {
    // One attempt at a time per part: the epoch is the routed chain's.
    requests[p].set_chain_epoch(attempt.chain_epoch);
    ShardChannel* target = attempt.target;
    grpc::ClientContext* context = attempt.context;
    auto send_grpc = [method, &requests, &responses, p, target,
                      context](std::function<void(grpc::Status)> done) {
      (target->stub()->async()->*method)(context, &requests[p], &responses[p], std::move(done));
    };
    // The shard's data port, when it has one (client/shard_channel.h).
    wire::FrameChannel* frames = target->frames(static_cast<int>(p % target->num_connections()));
    if (frames == nullptr) {
      send_grpc(std::move(done));
      return;
    }
    struct Buffers {
      grpc::ByteBuffer request;
      grpc::ByteBuffer response;
    };
    auto buffers = std::make_shared<Buffers>();
    bool own = false;
    const grpc::Status serialized =
        grpc::SerializationTraits<Request>::Serialize(requests[p], &buffers->request, &own);
    if (!serialized.ok()) {
      done(serialized);
      return;
    }
    frames->Call(frame_method, buffers->request, &buffers->response,
                 absl::FromChrono(context->deadline()),
                 [buffers, &responses, p, target, send_grpc, done = std::move(done)](
                     grpc::Status status, bool reached) mutable {
                   if (!reached) {
                     target->FramesUnreachable();
                     send_grpc(std::move(done));
                     return;
                   }
                   if (status.ok()) {
                     status = grpc::SerializationTraits<Response>::Deserialize(
                         &buffers->response, &responses[p]);
                   }
                   done(std::move(status));
                 },
                 attempt.cancel.get());
  };
}

absl::Status TableClient::CallTable(const std::string& table, const char* method,
                                    const std::vector<Part>& parts, const StartFn& start,
                                    absl::Duration attempt_timeout) {
  absl::Status status = CallParts(method, parts, start, attempt_timeout);
  if (!absl::IsNotFound(status)) return status;
  RETURN_IF_ERROR(Reregister(table, status));
  return CallParts(method, parts, start, attempt_timeout);
}

absl::Status TableClient::Register(const std::vector<TableSpec>& tables) {
  RegisterTablesRequest request;
  for (const TableSpec& spec : tables) *request.add_tables() = spec;
  std::vector<Part> all(client_->num_shards());
  for (int s = 0; s < client_->num_shards(); ++s) all[s].shard = s;
  std::vector<RegisterTablesResponse> responses(all.size());
  RETURN_IF_ERROR(CallParts(
      "RegisterTables", all,
      [this, &request, &responses](size_t s, const ShardAttempt& attempt,
                                   std::function<void(grpc::Status)> done) {
        ShardChannel* channel = client_->channel(static_cast<int>(s));
        channel->stub()->async()->RegisterTables(
            attempt.context, &request, &responses[s],
            [channel, &responses, s, done = std::move(done)](grpc::Status status) {
              // Where the shard takes the table calls' frames (a client
              // of tables alone registers no worker, so learns it here).
              if (status.ok()) channel->set_data_port(static_cast<int>(responses[s].data_port()));
              done(std::move(status));
            });
      },
      client_->options().rpc_timeout));
  for (const TableSpec& spec : tables) {
    auto [it, fresh] = tables_.try_emplace(spec.name());
    if (fresh) specs_.push_back(spec);
    it->second.dim = spec.dim();
    it->second.sync = spec.sync();
  }
  return absl::OkStatus();
}

absl::Status TableClient::Reregister(const std::string& table, const absl::Status& why) {
  // A shard restarted without a checkpoint holding the table: its share of
  // the rows starts over from their initial values.
  LOG(WARNING) << "a shard does not hold table \"" << table << "\" any more (" << why.message()
               << "): registering the tables again; that shard's rows start over";
  std::vector<TableSpec> specs = specs_;
  return Register(specs);
}

void TableClient::Dedup(absl::Span<const uint64_t> ids, bool every_shard_once, Batch* batch) {
  batch->inverse.resize(ids.size());
  batch->unique.clear();
  std::vector<std::vector<uint32_t>> by_shard(static_cast<size_t>(client_->num_shards()));
  if (sparse::StrictlyIncreasing(ids)) {
    // Unique already (SparseEmbedding's batches are: torch.unique sorts
    // them): no hash table, 0.3 instead of 10 ns an id.
    batch->unique.assign(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size(); ++i) {
      batch->inverse[i] = static_cast<uint32_t>(i);
      by_shard[sparse::ShardOfId(ids[i], client_->num_shards())].push_back(
          static_cast<uint32_t>(i));
    }
  } else {
    positions_.Reset(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      auto [first, fresh] =
          positions_.Insert(ids[i], static_cast<uint32_t>(batch->unique.size()));
      if (fresh) {
        batch->unique.push_back(ids[i]);
        by_shard[sparse::ShardOfId(ids[i], client_->num_shards())].push_back(first);
      }
      batch->inverse[i] = first;
    }
  }
  batch->parts.clear();
  for (int s = 0; s < client_->num_shards(); ++s) {
    const std::vector<uint32_t>& mine = by_shard[s];
    if (every_shard_once) {
      batch->parts.push_back({s, mine});
      continue;
    }
    for (size_t from = 0; from < mine.size(); from += kIdsPerCall) {
      Part& part = batch->parts.emplace_back();
      part.shard = s;
      part.unique.assign(mine.begin() + from,
                         mine.begin() + std::min(mine.size(), from + kIdsPerCall));
    }
  }
}

absl::Status TableClient::Lookup(const std::string& table, absl::Span<const uint64_t> ids,
                                 bool train, int64_t clock, float* out, TableCallStats* stats) {
  ASSIGN_OR_RETURN(const Registered* registered, Find(table));
  const int32_t d = registered->dim;
  const DType wire = registered->wire;
  // A sync table's training lookup waits on every shard for the step its
  // last push ended.
  const bool waits = train && registered->sync;
  Batch batch;
  Dedup(ids, waits, &batch);
  const std::vector<Part>& parts = batch.parts;
  std::vector<LookupRequest> requests(parts.size());
  std::vector<LookupResponse> responses(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    requests[p].set_table(table);
    requests[p].set_ids(IdBytes(batch.unique, parts[p].unique));
    requests[p].set_train(train);
    requests[p].set_worker(static_cast<uint32_t>(client_->options().worker_index));
    requests[p].set_clock(clock);
    requests[p].set_dtype(wire);
    requests[p].set_group(parts[p].shard);
  }
  RETURN_IF_ERROR(CallTable(
      table, "Lookup", parts,
      Send(wire::DataMethod::kLookup, &ParameterServer::Stub::async::Lookup, requests,
           responses),
      waits ? client_->options().pull_timeout : client_->options().rpc_timeout));
  const size_t row_bytes = static_cast<size_t>(common::DTypeSize(wire)) * d;
  // Where each unique id's row is in the responses: the rows are copied
  // (or converted to f32) once, from there into out.
  std::vector<const char*> row_of(batch.unique.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::string& rows = responses[p].rows();
    if (rows.size() != parts[p].unique.size() * row_bytes) {
      return absl::DataLossError(absl::StrFormat(
          "shard %d answered %d bytes of rows for %d ids of dim %d", parts[p].shard,
          rows.size(), parts[p].unique.size(), d));
    }
    for (size_t k = 0; k < parts[p].unique.size(); ++k) {
      row_of[parts[p].unique[k]] = rows.data() + k * row_bytes;
    }
  }
  if (wire == DTYPE_F32) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(out + i * d, row_of[batch.inverse[i]], row_bytes);
    }
  } else {
    // The sizes were checked above.
    for (size_t i = 0; i < ids.size(); ++i) {
      common::DecodeDenseFrom(wire, row_of[batch.inverse[i]], absl::MakeSpan(out + i * d, d));
    }
  }
  if (stats != nullptr) {
    stats->ids = static_cast<int64_t>(ids.size());
    stats->unique_ids = static_cast<int64_t>(batch.unique.size());
  }
  return absl::OkStatus();
}

absl::Status TableClient::Push(const std::string& table, absl::Span<const uint64_t> ids,
                               const float* grads, int64_t clock, TableCallStats* stats) {
  ASSIGN_OR_RETURN(const Registered* registered, Find(table));
  const int32_t d = registered->dim;
  const DType wire = registered->wire;
  Batch batch;
  Dedup(ids, registered->sync, &batch);
  // Duplicate ids' gradients summed into one row each. Without repeats,
  // unique id u is ids[u] and its gradient is the caller's row u.
  std::vector<float> summed;
  const float* rows = grads;
  if (batch.unique.size() != ids.size()) {
    summed.assign(batch.unique.size() * d, 0.0f);
    for (size_t i = 0; i < ids.size(); ++i) {
      float* row = &summed[static_cast<size_t>(batch.inverse[i]) * d];
      const float* g = grads + i * d;
      for (int32_t j = 0; j < d; ++j) row[j] += g[j];
    }
    rows = summed.data();
  }
  const size_t row_bytes = static_cast<size_t>(common::DTypeSize(wire)) * d;
  const std::vector<Part>& parts = batch.parts;
  std::vector<PushSparseRequest> requests(parts.size());
  std::vector<PushSparseResponse> responses(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    PushSparseRequest& r = requests[p];
    r.set_worker(static_cast<uint32_t>(client_->options().worker_index));
    r.set_worker_incarnation(client_->worker_incarnation());
    r.set_sequence(client_->channel(parts[p].shard)->NextSparseSequence());
    r.set_clock(clock);
    r.set_table(table);
    r.set_ids(IdBytes(batch.unique, parts[p].unique));
    r.set_dtype(wire);
    r.set_group(parts[p].shard);
    std::string* g = r.mutable_grads();
    g->resize(parts[p].unique.size() * row_bytes);
    for (size_t k = 0; k < parts[p].unique.size(); ++k) {
      common::EncodeDenseInto(
          absl::MakeConstSpan(rows + static_cast<size_t>(parts[p].unique[k]) * d, d), wire,
          g->data() + k * row_bytes);
    }
  }
  RETURN_IF_ERROR(CallTable(
      table, "PushSparse", parts,
      Send(wire::DataMethod::kPushSparse, &ParameterServer::Stub::async::PushSparse, requests,
           responses),
      client_->options().rpc_timeout));
  if (stats != nullptr) {
    stats->ids = static_cast<int64_t>(ids.size());
    stats->unique_ids = static_cast<int64_t>(batch.unique.size());
    stats->dropped = 0;
    stats->duplicates = 0;
    for (const PushSparseResponse& response : responses) {
      stats->dropped += response.dropped();
      stats->duplicates += response.duplicate() ? 1 : 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::client
