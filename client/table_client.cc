#include "client/table_client.h"

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
#include "common/metrics.h"
#include "common/status_macros.h"
#include "sparse/id_hash.h"

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

TableClient::TableClient(PsClient* client)
    : client_(client), next_sequence_(static_cast<size_t>(client->num_shards()), 0) {}

int32_t TableClient::dim(const std::string& table) const {
  auto it = dims_.find(table);
  return it == dims_.end() ? 0 : it->second;
}

absl::Status TableClient::CallShards(
    const char* method, const std::vector<int>& shards,
    const std::function<void(int, grpc::ClientContext*, std::function<void(grpc::Status)>)>&
        start) {
  const int n = static_cast<int>(shards.size());
  std::vector<absl::Status> statuses(n);
  absl::BlockingCounter pending(n);
  for (int i = 0; i < n; ++i) {
    const int s = shards[i];
    ShardRpc rpc;
    rpc.method = method;
    rpc.attempt_timeout = client_->options().rpc_timeout;
    rpc.reconnect_timeout = client_->options().reconnect_timeout;
    rpc.start = [&start, s, method, this](const ShardAttempt& attempt,
                                           std::function<void(grpc::Status)> done) {
      const absl::Time begin = absl::Now();
      start(s, attempt.context,
            [this, method, begin, done = std::move(done)](grpc::Status status) {
              if (client_->rpc_metrics() != nullptr) {
                client_->rpc_metrics()->Record(method, status.error_code(), 0, 0,
                                               absl::ToDoubleSeconds(absl::Now() - begin));
              }
              done(std::move(status));
            });
    };
    client_->channel(s)->Call(std::move(rpc), [&statuses, &pending, i](absl::Status status) {
      statuses[i] = std::move(status);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  for (absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status TableClient::Register(const std::vector<TableSpec>& tables) {
  RegisterTablesRequest request;
  for (const TableSpec& spec : tables) *request.add_tables() = spec;
  std::vector<int> all(client_->num_shards());
  for (int s = 0; s < client_->num_shards(); ++s) all[s] = s;
  std::vector<RegisterTablesResponse> responses(all.size());
  RETURN_IF_ERROR(CallShards(
      "RegisterTables", all,
      [this, &request, &responses](int s, grpc::ClientContext* context,
                                   std::function<void(grpc::Status)> done) {
        client_->channel(s)->stub()->async()->RegisterTables(context, &request, &responses[s],
                                                             std::move(done));
      }));
  for (const TableSpec& spec : tables) {
    if (!dims_.contains(spec.name())) specs_.push_back(spec);
    dims_[spec.name()] = spec.dim();
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

void TableClient::Dedup(absl::Span<const uint64_t> ids, Batch* batch) const {
  absl::flat_hash_map<uint64_t, uint32_t> position;
  position.reserve(ids.size());
  batch->inverse.resize(ids.size());
  batch->unique.clear();
  batch->by_shard.assign(static_cast<size_t>(client_->num_shards()), {});
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = position.try_emplace(ids[i], static_cast<uint32_t>(batch->unique.size()));
    if (fresh) {
      batch->unique.push_back(ids[i]);
      batch->by_shard[sparse::ShardOfId(ids[i], client_->num_shards())].push_back(it->second);
    }
    batch->inverse[i] = it->second;
  }
}

absl::Status TableClient::Lookup(const std::string& table, absl::Span<const uint64_t> ids,
                                 bool train, int64_t clock, float* out, TableCallStats* stats) {
  const int32_t d = dim(table);
  if (d == 0) {
    return absl::NotFoundError(absl::StrCat("table \"", table, "\" is not registered"));
  }
  Batch batch;
  Dedup(ids, &batch);
  std::vector<int> shards;
  std::vector<LookupRequest> requests(client_->num_shards());
  std::vector<LookupResponse> responses(client_->num_shards());
  for (int s = 0; s < client_->num_shards(); ++s) {
    if (batch.by_shard[s].empty()) continue;
    shards.push_back(s);
    requests[s].set_table(table);
    requests[s].set_ids(IdBytes(batch.unique, batch.by_shard[s]));
    requests[s].set_train(train);
    requests[s].set_worker(static_cast<uint32_t>(client_->options().worker_index));
    requests[s].set_clock(clock);
  }
  auto call = [&] {
    return CallShards("Lookup", shards,
                      [this, &requests, &responses](int s, grpc::ClientContext* context,
                                                    std::function<void(grpc::Status)> done) {
                        client_->channel(s)->stub()->async()->Lookup(
                            context, &requests[s], &responses[s], std::move(done));
                      });
  };
  absl::Status status = call();
  if (absl::IsNotFound(status)) {
    RETURN_IF_ERROR(Reregister(table, status));
    status = call();
  }
  RETURN_IF_ERROR(status);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(d);
  std::vector<float> unique_rows(batch.unique.size() * d);
  for (int s : shards) {
    const std::string& rows = responses[s].rows();
    if (rows.size() != batch.by_shard[s].size() * row_bytes) {
      return absl::DataLossError(absl::StrFormat(
          "shard %d answered %d bytes of rows for %d ids of dim %d", s, rows.size(),
          batch.by_shard[s].size(), d));
    }
    for (size_t k = 0; k < batch.by_shard[s].size(); ++k) {
      std::memcpy(&unique_rows[static_cast<size_t>(batch.by_shard[s][k]) * d],
                  rows.data() + k * row_bytes, row_bytes);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    std::memcpy(out + i * d, &unique_rows[static_cast<size_t>(batch.inverse[i]) * d], row_bytes);
  }
  if (stats != nullptr) {
    stats->ids = static_cast<int64_t>(ids.size());
    stats->unique_ids = static_cast<int64_t>(batch.unique.size());
  }
  return absl::OkStatus();
}

absl::Status TableClient::Push(const std::string& table, absl::Span<const uint64_t> ids,
                               const float* grads, int64_t clock, TableCallStats* stats) {
  const int32_t d = dim(table);
  if (d == 0) {
    return absl::NotFoundError(absl::StrCat("table \"", table, "\" is not registered"));
  }
  Batch batch;
  Dedup(ids, &batch);
  // Duplicate ids' gradients summed into one row each.
  std::vector<float> summed(batch.unique.size() * d, 0.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    float* row = &summed[static_cast<size_t>(batch.inverse[i]) * d];
    const float* g = grads + i * d;
    for (int32_t j = 0; j < d; ++j) row[j] += g[j];
  }
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(d);
  std::vector<int> shards;
  std::vector<PushSparseRequest> requests(client_->num_shards());
  std::vector<PushSparseResponse> responses(client_->num_shards());
  for (int s = 0; s < client_->num_shards(); ++s) {
    if (batch.by_shard[s].empty()) continue;
    shards.push_back(s);
    PushSparseRequest& r = requests[s];
    r.set_worker(static_cast<uint32_t>(client_->options().worker_index));
    r.set_worker_incarnation(client_->worker_incarnation());
    r.set_sequence(++next_sequence_[s]);
    r.set_clock(clock);
    r.set_table(table);
    r.set_ids(IdBytes(batch.unique, batch.by_shard[s]));
    std::string* g = r.mutable_grads();
    g->resize(batch.by_shard[s].size() * row_bytes);
    for (size_t k = 0; k < batch.by_shard[s].size(); ++k) {
      std::memcpy(g->data() + k * row_bytes,
                  &summed[static_cast<size_t>(batch.by_shard[s][k]) * d], row_bytes);
    }
  }
  auto call = [&] {
    return CallShards("PushSparse", shards,
                      [this, &requests, &responses](int s, grpc::ClientContext* context,
                                                    std::function<void(grpc::Status)> done) {
                        client_->channel(s)->stub()->async()->PushSparse(
                            context, &requests[s], &responses[s], std::move(done));
                      });
  };
  absl::Status status = call();
  if (absl::IsNotFound(status)) {
    RETURN_IF_ERROR(Reregister(table, status));
    status = call();
  }
  RETURN_IF_ERROR(status);
  if (stats != nullptr) {
    stats->ids = static_cast<int64_t>(ids.size());
    stats->unique_ids = static_cast<int64_t>(batch.unique.size());
    stats->dropped = 0;
    stats->duplicates = 0;
    for (int s : shards) {
      stats->dropped += responses[s].dropped();
      stats->duplicates += responses[s].duplicate() ? 1 : 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::client
