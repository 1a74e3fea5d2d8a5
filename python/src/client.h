// PyClient: the object behind shardtrain.Client, a PsClient
// (client/ps_client.h) driven from Python.
//
// Every call that talks to the shards releases the GIL for as long as it
// does. Buffers are checked (float32, C-contiguous, the tensor's element
// count, writable for parameters; python/src/buffers.h) before anything is
// sent, and their exports are held while the client may read or write
// them: for push/pull until the call returns, for start_exchange until
// finish_exchanges returns. Errors of the client library raise
// ShardtrainError (python/src/errors.h).
//
//   c = shardtrain.Client(["127.0.0.1:5000"], worker=0, num_workers=1)
//   c.register([("w", (4, 3), shardtrain.Init("glorot_uniform", seed=1))])
//   c.pull(0, 0, [w])
//   c.push(1, [grad])
//
// Thread-safe: the dense data calls (register, push, pull, push_pull,
// start_exchange, finish_exchanges) run one at a time; the table calls
// (register_tables, lookup, push_sparse and their _async forms) run one at
// a time in the order they were made, on a thread of the client's own
// (python/src/table_queue.h), beside the dense calls: a lookup or a push
// started with the _async form overlaps the caller's compute and the dense
// exchange. heartbeat, status and the metrics may run beside them from
// another thread; close runs the table calls already started, then waits
// for every call under way.
#ifndef SHARDTRAIN_PYTHON_SRC_CLIENT_H_
#define SHARDTRAIN_PYTHON_SRC_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "client/table_client.h"
#include "python/src/buffers.h"
#include "python/src/client_options.h"
#include "python/src/step_metrics.h"
#include "python/src/table_call.h"
#include "python/src/table_queue.h"
#include "python/src/tensors.h"

namespace shardtrain::python {

class PyClient {
 public:
  // Connects lazily (the first RPC waits for the shards). ValueError for a
  // bad setting, ShardtrainError for what PsClient::Create refuses.
  explicit PyClient(const ClientArgs& args);
  // Closes.
  ~PyClient();
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  void Register(pybind11::handle tensors);
  pybind11::dict Push(int64_t clock, pybind11::handle grads);
  pybind11::dict Pull(int64_t clock, int64_t min_version, pybind11::handle params);
  pybind11::dict PushPull(int64_t clock, int64_t min_version, pybind11::handle grads,
                          pybind11::handle params);
  void StartExchange(int64_t tensor, int64_t clock, int64_t min_version,
                     pybind11::handle grad, pybind11::handle params);
  pybind11::dict FinishExchanges();
  pybind11::dict Heartbeat(int64_t clock, bool done);
  pybind11::list Status();
  // Sparse tables (client/table_client.h). specs: dicts of TableSpec's
  // fields. ids: a C-contiguous buffer of 8-byte integers (numpy int64 or
  // uint64, a torch CPU int64 tensor); out and grads: float32 buffers of
  // len(ids) * dim.
  void RegisterTables(pybind11::handle specs);
  pybind11::dict Lookup(const std::string& table, pybind11::handle ids, pybind11::handle out,
                        bool train, int64_t clock);
  pybind11::dict PushSparse(const std::string& table, pybind11::handle ids,
                            pybind11::handle grads, int64_t clock);
  // As Lookup and PushSparse, but return as soon as the call is queued: the
  // handle's wait() gives its stats or raises its error. The buffers are
  // held until the call has run and must not be changed before.
  std::unique_ptr<TableCall> LookupAsync(const std::string& table, pybind11::handle ids,
                                         pybind11::handle out, bool train, int64_t clock);
  std::unique_ptr<TableCall> PushSparseAsync(const std::string& table, pybind11::handle ids,
                                             pybind11::handle grads, int64_t clock);
  // A registered table's dim (0: not registered through this client).
  int64_t TableDim(const std::string& table);
  void SetTableWireDType(const std::string& table, const std::string& dtype);
  void RecordStep(const StepRecord& step);
  void RecordEpoch(int64_t epoch, double test_accuracy, double samples_per_second);
  // Finishes any exchange under way (its error is dropped), disconnects and
  // stops the metrics endpoint. Later calls raise ShardtrainError
  // (FAILED_PRECONDITION); closing again does nothing.
  void Close();

  int metrics_port() const { return metrics_port_.load(); }
  int64_t registered_worker_clock();
  pybind11::tuple known_versions();
  bool closed();
  int64_t worker() const { return worker_; }
  int64_t num_tensors();

 private:
  class DataCall;

  // Checks one buffer per registered tensor: `what` ("gradient",
  // "parameters") names them in errors.
  std::vector<FloatBuffer> Buffers(pybind11::handle list, const char* what, bool writable);
  // FAILED_PRECONDITION unless the client is open, registered and has no
  // exchange under way.
  void CheckReady(const char* call, bool exchange_ok) const
      ABSL_SHARED_LOCKS_REQUIRED(life_mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(data_mu_);
  // On the table thread: fn(the TableClient, made at the first call), or
  // FAILED_PRECONDITION naming `call` on a closed client.
  absl::Status OnTables(const char* call,
                        absl::FunctionRef<absl::Status(client::TableClient&)> fn)
      ABSL_LOCKS_EXCLUDED(life_mu_, table_mu_);
  // The dim of a table registered through this client, or ValueError.
  int64_t RegisteredDim(const std::string& table) ABSL_LOCKS_EXCLUDED(dims_mu_);

  const int64_t worker_;
  const bool send_values_;  // worker 0: KIND_VALUES tensors carry their values
  std::atomic<int> metrics_port_{-1};

  // Held shared by every call and exclusively by Close: client_ and
  // metrics_ live while a call uses them.
  mutable absl::Mutex life_mu_;
  std::unique_ptr<ClientMetrics> metrics_ ABSL_GUARDED_BY(life_mu_);
  std::unique_ptr<client::PsClient> client_ ABSL_GUARDED_BY(life_mu_);

  // Held by the data calls, one at a time (after life_mu_).
  mutable absl::Mutex data_mu_ ABSL_ACQUIRED_AFTER(life_mu_);
  std::vector<TensorInfo> tensors_ ABSL_GUARDED_BY(data_mu_);
  // The buffers of the exchanges under way, and which tensors they are for.
  // Created and destroyed with the GIL held.
  std::vector<FloatBuffer> exchange_buffers_ ABSL_GUARDED_BY(data_mu_);
  std::vector<bool> exchanging_ ABSL_GUARDED_BY(data_mu_);
  int exchanges_ ABSL_GUARDED_BY(data_mu_) = 0;

  // The table calls, in order, on the queue's thread.
  TableQueue table_queue_;
  // Held by that thread for a call (after life_mu_). Made by the first
  // table call.
  mutable absl::Mutex table_mu_ ABSL_ACQUIRED_AFTER(life_mu_);
  std::unique_ptr<client::TableClient> tables_ ABSL_GUARDED_BY(table_mu_);
  // The dims of the tables registered, for checking buffers when a call is
  // made (table_mu_ may be held by a call under way).
  mutable absl::Mutex dims_mu_;
  absl::flat_hash_map<std::string, int64_t> table_dims_ ABSL_GUARDED_BY(dims_mu_);
};

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_CLIENT_H_
