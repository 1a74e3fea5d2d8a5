// shardtrain._core: the Python binding of the parameter-server client.
// python/shardtrain/__init__.py re-exports Client, Init, ShardtrainError,
// TableCall and __version__; see python/src/client.h for the semantics.
#include <glog/logging.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "absl/strings/str_cat.h"
#include "app/deadlock_detection.h"
#include "python/src/client.h"
#include "python/src/errors.h"
#include "python/src/table_call.h"
#include "python/src/tensors.h"

namespace py = pybind11;
using namespace shardtrain::python;  // NOLINT: the module's one binding file

namespace {

void InitLogging() {
  if (google::IsGoogleLoggingInitialized()) return;
  FLAGS_logtostderr = true;
  google::InitGoogleLogging("shardtrain");
}

constexpr char kClientDoc[] = R"doc(
A worker's connection to every shard of a shardtrain parameter server.

Client(servers, worker=0, num_workers=0, *, sync=False, wire_dtype="f32",
       topk_ratio=0.0, tls_ca="", tls_cert="", tls_key="", token="",
       rpc_timeout=30.0, pull_timeout=300.0, reconnect_timeout=120.0,
       replicas=1, etcd_endpoints="", job="shardtrain", metrics_port=-1,
       max_partition_elements=16384, channels_per_shard=4, max_message_mb=256,
       keepalive=10.0, tls_server_name="", token_file="", etcd_ca="",
       etcd_cert="", etcd_key="", exchanges_cover_every_tensor=False)

servers are the shard addresses in shard order; worker is this worker's
index, num_workers the job's size (0: not checked). The settings are
ps-worker's flags: TLS files (tls_ca turns TLS on; tls_cert/tls_key for
mutual TLS), the auth token (its value, or token_file as --auth_token_file;
it needs TLS), timeouts in seconds, top-k compression, the wire dtype
("f32", "f16", "bf16"), replicated shards (replicas > 1, with etcd; etcd_ca,
etcd_cert, etcd_key as --etcd_ca/--etcd_cert/--etcd_key for an etcd with TLS), and
max_partition_elements, which must match the shards'. metrics_port >= 0
serves ps-worker's Prometheus metrics on 0.0.0.0:metrics_port (0: a free
port, see .metrics_port). exchanges_cover_every_tensor=True promises that
every step calls start_exchange for every registered tensor (the
optimizer's step() does): async shards then move this worker's clock with
a step's last tensor instead of its first, so the staleness bound holds
within a step too; a step that leaves a tensor out would hold this
worker's clock a step behind.

Buffers are float32, C-contiguous objects with the buffer protocol (numpy
arrays, memoryviews) or torch CPU tensors, with exactly the tensor's
element count; parameter buffers must be writable. They are used in place,
without copies. The GIL is released during every call to the shards.
Errors from the shards or the network raise ShardtrainError (.code,
.message); bad buffers raise TypeError or ValueError naming the tensor.
)doc";

}  // namespace

PYBIND11_MODULE(_core, m) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  InitLogging();
  m.doc() = "The shardtrain parameter-server client (C++ extension).";
  m.attr("__version__") = SHARDTRAIN_VERSION;
  RegisterErrors(m);

  py::class_<Init>(m, "Init", "An initialiser the shards compute for a tensor.")
      .def(py::init([](const std::string& kind, double scale, uint64_t seed) {
             ParseInitKind(kind);
             return Init{kind, scale, seed};
           }),
           py::arg("kind") = "zeros", py::arg("scale") = 0.0, py::arg("seed") = 0,
           "kind: zeros, constant (value scale), uniform (U(-scale, scale)), normal "
           "(N(0, scale^2)), glorot_uniform or he_uniform; seed makes the values "
           "deterministic.")
      .def_readonly("kind", &Init::kind)
      .def_readonly("scale", &Init::scale)
      .def_readonly("seed", &Init::seed)
      .def("__repr__", [](const Init& init) {
        return absl::StrCat("shardtrain.Init('", init.kind, "', scale=", init.scale,
                            ", seed=", init.seed, ")");
      });

  py::class_<TableCall>(m, "TableCall",
                        "A table call started with Client.lookup_async() or "
                        "push_sparse_async(); its buffers are held until it has run.")
      .def("done", &TableCall::done, "done() -> bool: whether the call has run.")
      .def("wait", &TableCall::Wait,
           "wait() -> dict(ids, unique_ids, dropped, duplicates): blocks until the call "
           "has run; its error raises ShardtrainError.");

  py::class_<PyClient>(m, "Client", kClientDoc)
      .def(py::init([](std::vector<std::string> servers, int64_t worker, int64_t num_workers,
                       bool sync, std::string wire_dtype, double topk_ratio,
                       std::string tls_ca, std::string tls_cert, std::string tls_key,
                       std::string token, double rpc_timeout, double pull_timeout,
                       double reconnect_timeout, int64_t replicas,
                       std::string etcd_endpoints, std::string job, int64_t metrics_port,
                       int64_t max_partition_elements, int64_t channels_per_shard,
                       int64_t max_message_mb, double keepalive,
                       std::string tls_server_name, std::string token_file,
                       std::string etcd_ca, std::string etcd_cert, std::string etcd_key,
                       bool exchanges_cover_every_tensor) {
             ClientArgs args;
             args.servers = std::move(servers);
             args.worker = worker;
             args.num_workers = num_workers;
             args.sync = sync;
             args.wire_dtype = std::move(wire_dtype);
             args.topk_ratio = topk_ratio;
             args.tls_ca = std::move(tls_ca);
             args.tls_cert = std::move(tls_cert);
             args.tls_key = std::move(tls_key);
             args.token = std::move(token);
             args.rpc_timeout = rpc_timeout;
             args.pull_timeout = pull_timeout;
             args.reconnect_timeout = reconnect_timeout;
             args.replicas = replicas;
             args.etcd_endpoints = std::move(etcd_endpoints);
             args.job = std::move(job);
             args.metrics_port = metrics_port;
             args.max_partition_elements = max_partition_elements;
             args.channels_per_shard = channels_per_shard;
             args.max_message_mb = max_message_mb;
             args.keepalive = keepalive;
             args.tls_server_name = std::move(tls_server_name);
             args.token_file = std::move(token_file);
             args.etcd_ca = std::move(etcd_ca);
             args.etcd_cert = std::move(etcd_cert);
             args.etcd_key = std::move(etcd_key);
             args.exchanges_cover_every_tensor = exchanges_cover_every_tensor;
             return std::make_unique<PyClient>(args);
           }),
           py::arg("servers"), py::arg("worker") = 0, py::arg("num_workers") = 0,
           py::kw_only(), py::arg("sync") = false, py::arg("wire_dtype") = "f32",
           py::arg("topk_ratio") = 0.0, py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("token") = "", py::arg("rpc_timeout") = 30.0,
           py::arg("pull_timeout") = 300.0, py::arg("reconnect_timeout") = 120.0,
           py::arg("replicas") = 1, py::arg("etcd_endpoints") = "",
           py::arg("job") = "shardtrain", py::arg("metrics_port") = -1,
           py::arg("max_partition_elements") = shardtrain::common::kDefaultMaxPartitionElements,
           py::arg("channels_per_shard") = 4, py::arg("max_message_mb") = 256,
           py::arg("keepalive") = 10.0, py::arg("tls_server_name") = "",
           py::arg("token_file") = "", py::arg("etcd_ca") = "", py::arg("etcd_cert") = "",
           py::arg("etcd_key") = "", py::arg("exchanges_cover_every_tensor") = false)
      .def_property_readonly("metrics_port", &PyClient::metrics_port,
                             "The port /metrics is served on, or -1.")
      .def_property_readonly("worker", &PyClient::worker, "This worker's index.")
      .def_property_readonly("registered_worker_clock", &PyClient::registered_worker_clock,
                             "The largest clock a shard recorded for this worker index at "
                             "register() (0 for a new job): a restarted worker resumes there.")
      .def_property_readonly("known_versions", &PyClient::known_versions,
                             "(smallest, largest) partition version this client knows.")
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("num_tensors", &PyClient::num_tensors)
      .def("register", &PyClient::Register, py::arg("tensors"),
           "register([(name, shape, init), ...]): registers the model's tensors on every "
           "shard (idempotent). init is a shardtrain.Init or a float32 buffer with the "
           "tensor's own values; with values, worker 0's create the parameters and the "
           "other workers wait (up to reconnect_timeout) until it has registered. "
           "Tensor i of push/pull is tensors[i].")
      .def("push", &PyClient::Push, py::arg("clock"), py::arg("grads"),
           "push(clock, grads) -> dict(max_staleness): one gradient per tensor, computed "
           "from the last pull; clock counts the steps finished including this one.")
      .def("pull", &PyClient::Pull, py::arg("clock"), py::arg("min_version"),
           py::arg("params"),
           "pull(clock, min_version, params) -> dict(server_wait_seconds, min_version): "
           "fetches every tensor into params once each partition has min_version updates "
           "(sync: the step number; async: 0) and clock is within the staleness bound.")
      .def("push_pull", &PyClient::PushPull, py::arg("clock"), py::arg("min_version"),
           py::arg("grads"), py::arg("params"),
           "push_pull(clock, min_version, grads, params) -> dict: push then pull in one "
           "round trip.")
      .def("start_exchange", &PyClient::StartExchange, py::arg("tensor"), py::arg("clock"),
           py::arg("min_version"), py::arg("grad"), py::arg("params"),
           "start_exchange(tensor, clock, min_version, grad, params): sends tensor index "
           "`tensor`'s gradient now and pulls its parameters into params, overlapped with "
           "the caller's work. Both buffers are held (and must not be changed) until "
           "finish_exchanges() returns.")
      .def("finish_exchanges", &PyClient::FinishExchanges,
           "finish_exchanges() -> dict(max_staleness, server_wait_seconds, min_version): "
           "waits for every started exchange; the first error raises.")
      .def("heartbeat", &PyClient::Heartbeat, py::arg("clock"), py::arg("done") = false,
           "heartbeat(clock, done=False) -> dict(workers=[dict(worker, clock, live, done, "
           "...)], incarnation): tells every shard this worker is alive at clock (or done) "
           "and returns the membership shard 0 sees.")
      .def("status", &PyClient::Status,
           "status() -> [dict]: every shard's StatusResponse, in shard order.")
      .def("register_tables", &PyClient::RegisterTables, py::arg("tables"),
           "register_tables([dict(name=, dim=, optimizer=, learning_rate=, ...), ...]): "
           "registers sparse embedding tables on every shard (idempotent for identical "
           "specs). Keys are TableSpec's fields (proto/shardtrain.proto); init is "
           "'INIT_UNIFORM', 'INIT_NORMAL' or 'INIT_ZEROS'.")
      .def("lookup", &PyClient::Lookup, py::arg("table"), py::arg("ids"), py::arg("out"),
           py::arg("train") = true, py::arg("clock") = 0,
           "lookup(table, ids, out, train=True, clock=0) -> dict(ids, unique_ids): the rows "
           "of ids (int64/uint64 buffer) into out (float32, len(ids) * dim). train: create "
           "unseen rows (admission permitting) and mark them used at clock; otherwise read "
           "only, unknown ids as their initial value.")
      .def("push_sparse", &PyClient::PushSparse, py::arg("table"), py::arg("ids"),
           py::arg("grads"), py::arg("clock") = 0,
           "push_sparse(table, ids, grads, clock=0) -> dict(ids, unique_ids, dropped, "
           "duplicates): applies row gradients (float32, len(ids) * dim; a repeated id's "
           "are summed), at most once however often the call is retried.")
      .def("lookup_async", &PyClient::LookupAsync, py::arg("table"), py::arg("ids"),
           py::arg("out"), py::arg("train") = true, py::arg("clock") = 0,
           "lookup_async(table, ids, out, train=True, clock=0) -> TableCall: lookup() "
           "started on the client's table thread after the table calls made before it; "
           "returns at once. out is written, and must not be touched, until wait().")
      .def("push_sparse_async", &PyClient::PushSparseAsync, py::arg("table"), py::arg("ids"),
           py::arg("grads"), py::arg("clock") = 0,
           "push_sparse_async(table, ids, grads, clock=0) -> TableCall: push_sparse() "
           "started on the client's table thread after the table calls made before it; "
           "returns at once. grads must not change until wait() (a handle dropped "
           "earlier waits for its call).")
      .def("set_table_wire_dtype", &PyClient::SetTableWireDType, py::arg("table"),
           py::arg("dtype"),
           "set_table_wire_dtype(table, dtype): rows and gradients of a registered table "
           "travel as 'f32' (the default), 'bf16' or 'f16' (half the bytes; the shards "
           "store f32).")
      .def("table_dim", &PyClient::TableDim, py::arg("table"),
           "table_dim(table) -> int: the dim of a table registered through this client, "
           "or 0.")
      .def(
          "record_step",
          [](PyClient& client, double compute_seconds, double push_seconds,
             double pull_seconds, double wait_seconds, double step_seconds, int64_t samples,
             double loss, int64_t staleness) {
            client.RecordStep({compute_seconds, push_seconds, pull_seconds, wait_seconds,
                               step_seconds, samples, loss, staleness});
          },
          py::arg("compute_seconds"), py::arg("push_seconds"), py::arg("pull_seconds"),
          py::arg("wait_seconds"), py::arg("step_seconds"), py::arg("samples"),
          py::arg("loss"), py::arg("staleness"),
          "Records one training step in the worker metrics (ps-worker's families).")
      .def("record_epoch", &PyClient::RecordEpoch, py::arg("epoch"),
           py::arg("test_accuracy"), py::arg("samples_per_second"),
           "Records an epoch's end; a negative test_accuracy or samples_per_second leaves "
           "that gauge unchanged.")
      .def("close", &PyClient::Close,
           "Finishes exchanges under way, disconnects and stops the metrics endpoint.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& client, py::args) { client.Close(); });
}
