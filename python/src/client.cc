#include "python/src/client.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "python/src/errors.h"
#include "python/src/proto_dict.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

void Refuse(const std::string& message) {
  throw StatusError(absl::FailedPreconditionError(message));
}

py::dict PushDict(const client::PushStats& push) {
  py::dict out;
  out["max_staleness"] = push.max_staleness;
  return out;
}

py::dict PullDict(const client::PullStats& pull) {
  py::dict out;
  out["server_wait_seconds"] = pull.server_wait_seconds;
  out["min_version"] = pull.min_version;
  return out;
}

bool Overlap(const FloatBuffer& a, const FloatBuffer& b) {
  return a.size() > 0 && b.size() > 0 && a.data() < b.data() + b.size() &&
         b.data() < a.data() + a.size();
}

}  // namespace

// Holds life_mu_ (shared) and data_mu_ for a data call. The GIL is released
// while it waits for them and held again when it has them, so a thread
// holding the locks can always get the GIL back.
class ABSL_SCOPED_LOCKABLE PyClient::DataCall {
 public:
  explicit DataCall(PyClient* client) ABSL_SHARED_LOCK_FUNCTION(client->life_mu_)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(client->data_mu_)
      : client_(client) {
    py::gil_scoped_release release;
    client_->life_mu_.ReaderLock();
    client_->data_mu_.Lock();
  }
  ~DataCall() ABSL_UNLOCK_FUNCTION() {
    client_->data_mu_.Unlock();
    client_->life_mu_.ReaderUnlock();
  }
  DataCall(const DataCall&) = delete;
  DataCall& operator=(const DataCall&) = delete;

 private:
  PyClient* const client_;
};

PyClient::PyClient(const ClientArgs& args)
    : worker_(args.worker), send_values_(args.worker == 0) {
  const client::PsClientOptions options = MakeClientOptions(args);
  absl::Status created;
  {
    py::gil_scoped_release release;
    absl::MutexLock lock(&life_mu_);
    absl::StatusOr<std::unique_ptr<ClientMetrics>> metrics =
        ClientMetrics::Create(static_cast<int>(args.metrics_port));
    if (!metrics.ok()) {
      created = metrics.status();
    } else {
      metrics_ = std::move(*metrics);
      metrics_port_ = metrics_->port();
      absl::StatusOr<std::unique_ptr<client::PsClient>> made =
          client::PsClient::Create(options, &metrics_->rpc(), &metrics_->faults());
      if (made.ok()) {
        client_ = std::move(*made);
        client_->set_sync_mode(args.sync);
      } else {
        created = made.status();
        metrics_.reset();
        metrics_port_ = -1;
      }
    }
  }
  ThrowIfError(created);
}

PyClient::~PyClient() { Close(); }

void PyClient::CheckReady(const char* call, bool exchange_ok) const {
  if (client_ == nullptr) Refuse(absl::StrCat(call, "() on a closed client"));
  if (tensors_.empty()) Refuse(absl::StrCat(call, "() before register()"));
  if (!exchange_ok && exchanges_ > 0) {
    Refuse(absl::StrCat(call, "() while ", exchanges_,
                        " exchanges are under way; call finish_exchanges() first"));
  }
}

std::vector<FloatBuffer> PyClient::Buffers(py::handle list, const char* what, bool writable) {
  const std::string name = writable ? "params" : "grads";
  if (!py::isinstance<py::sequence>(list) || py::isinstance<py::str>(list)) {
    throw py::type_error(absl::StrCat(name, " must be a list of float32 buffers, one per "
                                            "registered tensor"));
  }
  std::vector<TensorInfo> tensors;
  {
    // The tensor list changes only in register(), a data call; reading it
    // here, before this call's own DataCall, needs the lock for a moment.
    py::gil_scoped_release release;
    absl::MutexLock lock(&data_mu_);
    tensors = tensors_;
  }
  if (tensors.empty()) Refuse("register() first: no tensors are registered");
  const size_t count = py::len(list);
  if (count != tensors.size()) {
    throw py::value_error(absl::StrCat(name, " has ", count, " buffers; ", tensors.size(),
                                       " tensors are registered"));
  }
  std::vector<FloatBuffer> buffers;
  buffers.reserve(count);
  size_t i = 0;
  for (py::handle item : list) {
    buffers.push_back(FloatBuffer::Get(item, absl::StrCat(what, " of ", tensors[i].name),
                                       tensors[i].elements, writable));
    ++i;
  }
  return buffers;
}

void PyClient::Register(py::handle tensors) {
  std::vector<TensorInfo> infos;
  std::vector<TensorSpec> specs = TensorSpecsFromPython(tensors, send_values_, &infos);
  if (specs.empty()) throw py::value_error("register() needs at least one tensor");
  DataCall call(this);
  if (client_ == nullptr) Refuse("register() on a closed client");
  if (exchanges_ > 0) Refuse("register() while exchanges are under way");
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->Register(specs);
  }
  ThrowIfError(status);
  tensors_ = std::move(infos);
  exchanging_.assign(tensors_.size(), false);
}

py::dict PyClient::Push(int64_t clock, py::handle grads) {
  std::vector<FloatBuffer> buffers = Buffers(grads, "gradient", /*writable=*/false);
  DataCall call(this);
  CheckReady("push", /*exchange_ok=*/false);
  std::vector<absl::Span<const float>> spans;
  for (const FloatBuffer& buffer : buffers) spans.push_back(buffer.const_span());
  client::PushStats stats;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->Push(clock, spans, &stats);
  }
  ThrowIfError(status);
  return PushDict(stats);
}

py::dict PyClient::Pull(int64_t clock, int64_t min_version, py::handle params) {
  std::vector<FloatBuffer> buffers = Buffers(params, "parameters", /*writable=*/true);
  DataCall call(this);
  CheckReady("pull", /*exchange_ok=*/false);
  std::vector<absl::Span<float>> spans;
  for (const FloatBuffer& buffer : buffers) spans.push_back(buffer.span());
  client::PullStats stats;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->Pull(clock, min_version, spans, &stats);
  }
  ThrowIfError(status);
  return PullDict(stats);
}

py::dict PyClient::PushPull(int64_t clock, int64_t min_version, py::handle grads,
                            py::handle params) {
  std::vector<FloatBuffer> grad_buffers = Buffers(grads, "gradient", /*writable=*/false);
  std::vector<FloatBuffer> param_buffers = Buffers(params, "parameters", /*writable=*/true);
  DataCall call(this);
  CheckReady("push_pull", /*exchange_ok=*/false);
  std::vector<absl::Span<const float>> grad_spans;
  std::vector<absl::Span<float>> param_spans;
  for (size_t t = 0; t < grad_buffers.size(); ++t) {
    if (Overlap(grad_buffers[t], param_buffers[t])) {
      throw py::value_error(absl::StrCat("the gradient and the parameters of ",
                                         tensors_[t].name, " share memory"));
    }
    grad_spans.push_back(grad_buffers[t].const_span());
    param_spans.push_back(param_buffers[t].span());
  }
  client::PushStats push;
  client::PullStats pull;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client_->PushPull(clock, min_version, grad_spans, param_spans, &push, &pull);
  }
  ThrowIfError(status);
  py::dict out = PushDict(push);
  for (auto item : PullDict(pull)) out[item.first] = item.second;
  return out;
}

void PyClient::StartExchange(int64_t tensor, int64_t clock, int64_t min_version,
                             py::handle grad, py::handle params) {
  TensorInfo info;
  {
    py::gil_scoped_release release;
    absl::MutexLock lock(&data_mu_);
    if (tensor >= 0 && tensor < static_cast<int64_t>(tensors_.size())) info = tensors_[tensor];
  }
  if (info.name.empty()) {
    throw py::index_error(absl::StrCat("start_exchange(): tensor ", tensor,
                                       " is not a registered tensor's index"));
  }
  FloatBuffer grad_buffer = FloatBuffer::Get(grad, absl::StrCat("gradient of ", info.name),
                                             info.elements, /*writable=*/false);
  FloatBuffer param_buffer = FloatBuffer::Get(
      params, absl::StrCat("parameters of ", info.name), info.elements, /*writable=*/true);
  if (Overlap(grad_buffer, param_buffer)) {
    throw py::value_error(
        absl::StrCat("the gradient and the parameters of ", info.name, " share memory"));
  }
  DataCall call(this);
  CheckReady("start_exchange", /*exchange_ok=*/true);
  if (exchanging_[tensor]) {
    throw py::value_error(absl::StrCat("tensor ", info.name,
                                       " is already being exchanged; call "
                                       "finish_exchanges() before exchanging it again"));
  }
  const absl::Span<const float> grad_span = grad_buffer.const_span();
  const absl::Span<float> param_span = param_buffer.span();
  exchange_buffers_.push_back(std::move(grad_buffer));
  exchange_buffers_.push_back(std::move(param_buffer));
  exchanging_[tensor] = true;
  ++exchanges_;
  py::gil_scoped_release release;
  client_->StartExchange(static_cast<int>(tensor), clock, min_version, grad_span, nullptr,
                         param_span);
}

py::dict PyClient::FinishExchanges() {
  std::vector<FloatBuffer> done;  // released with the GIL held, on return
  DataCall call(this);
  if (client_ == nullptr) Refuse("finish_exchanges() on a closed client");
  client::PushStats push;
  client::PullStats pull;
  absl::Status status;
  if (exchanges_ > 0) {
    py::gil_scoped_release release;
    status = client_->FinishExchanges(&push, &pull);
    done.swap(exchange_buffers_);
    exchanging_.assign(exchanging_.size(), false);
    exchanges_ = 0;
  }
  ThrowIfError(status);
  py::dict out = PushDict(push);
  for (auto item : PullDict(pull)) out[item.first] = item.second;
  return out;
}

py::dict PyClient::Heartbeat(int64_t clock, bool done) {
  absl::StatusOr<HeartbeatResponse> response =
      absl::FailedPreconditionError("heartbeat() on a closed client");
  {
    py::gil_scoped_release release;
    absl::ReaderMutexLock lock(&life_mu_);
    if (client_ != nullptr) response = client_->Heartbeat(clock, done, absl::InfiniteDuration());
  }
  ThrowIfError(response.status());
  return MessageToDict(*response);
}

py::list PyClient::Status() {
  absl::StatusOr<std::vector<StatusResponse>> shards =
      absl::FailedPreconditionError("status() on a closed client");
  {
    py::gil_scoped_release release;
    absl::ReaderMutexLock lock(&life_mu_);
    if (client_ != nullptr) shards = client_->ClusterStatus();
  }
  ThrowIfError(shards.status());
  py::list out;
  for (const StatusResponse& shard : *shards) out.append(MessageToDict(shard));
  return out;
}

void PyClient::RecordStep(const StepRecord& step) {
  if (step.samples < 0) throw py::value_error("record_step(): samples must be >= 0");
  py::gil_scoped_release release;
  absl::ReaderMutexLock lock(&life_mu_);
  if (metrics_ != nullptr) metrics_->RecordStep(step);
}

void PyClient::RecordEpoch(int64_t epoch, double test_accuracy, double samples_per_second) {
  py::gil_scoped_release release;
  absl::ReaderMutexLock lock(&life_mu_);
  if (metrics_ != nullptr) metrics_->RecordEpoch(epoch, test_accuracy, samples_per_second);
}

void PyClient::Close() {
  std::vector<FloatBuffer> released;  // destroyed with the GIL held, on return
  py::gil_scoped_release release;
  // The table calls already started run first (a push started is a push
  // made); later ones fail.
  table_queue_.Close();
  absl::MutexLock life(&life_mu_);
  absl::MutexLock data(&data_mu_);
  if (client_ != nullptr && exchanges_ > 0) {
    client::PushStats push;
    client::PullStats pull;
    const absl::Status dropped = client_->FinishExchanges(&push, &pull);
    (void)dropped;  // closing: nobody is left to tell
  }
  released.swap(exchange_buffers_);
  exchanging_.clear();
  exchanges_ = 0;
  {
    absl::MutexLock tables(&table_mu_);
    tables_.reset();
  }
  client_.reset();
  metrics_.reset();
  metrics_port_ = -1;
}

namespace {

// The ids of a buffer of 8-byte integers, copied.
std::vector<uint64_t> IdsOf(py::handle object) {
  py::object source = py::reinterpret_borrow<py::object>(object);
  if (!PyObject_CheckBuffer(source.ptr()) && py::hasattr(source, "numpy")) {
    source = source.attr("detach")().attr("cpu")().attr("numpy")();
  }
  py::buffer_info info = py::buffer(source).request();
  const std::string format = info.format;
  const bool integer = !format.empty() && std::string("qQlL").find(format.back()) != std::string::npos;
  if (info.itemsize != 8 || !integer) {
    throw py::type_error(absl::StrCat("ids must be 8-byte integers (int64 or uint64), got format '",
                                      format, "'"));
  }
  if (info.ndim > 1 && info.strides.back() != 8) {
    throw py::value_error("ids must be C-contiguous");
  }
  if (info.ndim == 1 && info.shape[0] > 1 && info.strides[0] != 8) {
    throw py::value_error("ids must be C-contiguous");
  }
  std::vector<uint64_t> ids(static_cast<size_t>(info.size));
  if (info.size > 0) std::memcpy(ids.data(), info.ptr, ids.size() * sizeof(uint64_t));
  return ids;
}

TableSpec TableSpecOf(py::handle object) {
  if (!py::isinstance<py::dict>(object)) throw py::type_error("a table spec must be a dict");
  TableSpec spec;
  const google::protobuf::Descriptor* d = spec.GetDescriptor();
  const google::protobuf::Reflection* r = spec.GetReflection();
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(object)) {
    const std::string name = py::str(key);
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(name);
    if (f == nullptr || f->is_repeated()) {
      throw py::value_error(absl::StrCat("unknown table spec field '", name, "'"));
    }
    using FD = google::protobuf::FieldDescriptor;
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32: r->SetInt32(&spec, f, value.cast<int32_t>()); break;
      case FD::CPPTYPE_INT64: r->SetInt64(&spec, f, value.cast<int64_t>()); break;
      case FD::CPPTYPE_UINT64: r->SetUInt64(&spec, f, value.cast<uint64_t>()); break;
      case FD::CPPTYPE_FLOAT: r->SetFloat(&spec, f, value.cast<float>()); break;
      case FD::CPPTYPE_BOOL: r->SetBool(&spec, f, value.cast<bool>()); break;
      case FD::CPPTYPE_STRING: r->SetString(&spec, f, value.cast<std::string>()); break;
      case FD::CPPTYPE_ENUM: {
        const std::string label = value.cast<std::string>();
        const google::protobuf::EnumValueDescriptor* e = f->enum_type()->FindValueByName(label);
        if (e == nullptr) {
          throw py::value_error(absl::StrCat("unknown value '", label, "' of table spec field '",
                                             name, "'"));
        }
        r->SetEnum(&spec, f, e);
        break;
      }
      default:
        throw py::value_error(absl::StrCat("table spec field '", name, "' cannot be set"));
    }
  }
  return spec;
}

}  // namespace

absl::Status PyClient::OnTables(const char* call,
                                absl::FunctionRef<absl::Status(client::TableClient&)> fn) {
  absl::ReaderMutexLock life(&life_mu_);
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(call, "() on a closed client"));
  }
  absl::MutexLock lock(&table_mu_);
  if (tables_ == nullptr) tables_ = std::make_unique<client::TableClient>(client_.get());
  return fn(*tables_);
}

int64_t PyClient::RegisteredDim(const std::string& table) {
  const int64_t dim = TableDim(table);
  if (dim == 0) throw py::value_error(absl::StrCat("table '", table, "' is not registered"));
  return dim;
}

void PyClient::RegisterTables(py::handle specs) {
  std::vector<TableSpec> tables;
  for (py::handle spec : specs) tables.push_back(TableSpecOf(spec));
  if (tables.empty()) throw py::value_error("register_tables() needs at least one table");
  std::shared_ptr<const TableQueue::Call> call =
      table_queue_.Add([this, tables](client::TableCallStats*) {
        return OnTables("register_tables", [&](client::TableClient& client) {
          return client.Register(tables);
        });
      });
  {
    py::gil_scoped_release release;
    call->Wait();
    if (call->status().ok()) {
      absl::MutexLock lock(&dims_mu_);
      for (const TableSpec& spec : tables) table_dims_[spec.name()] = spec.dim();
    }
  }
  ThrowIfError(call->status());
}

void PyClient::SetTableWireDType(const std::string& table, const std::string& dtype) {
  absl::StatusOr<DType> parsed = common::ParseDTypeName(dtype);
  if (!parsed.ok()) throw py::value_error(std::string(parsed.status().message()));
  RegisteredDim(table);
  std::shared_ptr<const TableQueue::Call> call =
      table_queue_.Add([this, table, wire = *parsed](client::TableCallStats*) {
        return OnTables("set_table_wire_dtype", [&](client::TableClient& client) {
          return client.SetWireDType(table, wire);
        });
      });
  {
    py::gil_scoped_release release;
    call->Wait();
  }
  ThrowIfError(call->status());
}

int64_t PyClient::TableDim(const std::string& table) {
  py::gil_scoped_release release;
  absl::MutexLock lock(&dims_mu_);
  auto it = table_dims_.find(table);
  return it == table_dims_.end() ? 0 : it->second;
}

std::unique_ptr<TableCall> PyClient::LookupAsync(const std::string& table, py::handle ids,
                                                 py::handle out, bool train, int64_t clock) {
  std::vector<uint64_t> id_list = IdsOf(ids);
  const int64_t dim = RegisteredDim(table);
  FloatBuffer rows = FloatBuffer::Get(out, absl::StrCat("rows of table ", table),
                                      static_cast<int64_t>(id_list.size()) * dim, true);
  std::shared_ptr<const TableQueue::Call> call = table_queue_.Add(
      [this, table, id_list = std::move(id_list), out = rows.data(), train,
       clock](client::TableCallStats* stats) {
        return OnTables("lookup", [&](client::TableClient& client) {
          return client.Lookup(table, id_list, train, clock, out, stats);
        });
      });
  return std::make_unique<TableCall>(std::move(call), std::move(rows));
}

std::unique_ptr<TableCall> PyClient::PushSparseAsync(const std::string& table, py::handle ids,
                                                     py::handle grads, int64_t clock) {
  std::vector<uint64_t> id_list = IdsOf(ids);
  const int64_t dim = RegisteredDim(table);
  FloatBuffer g = FloatBuffer::Get(grads, absl::StrCat("gradients of table ", table),
                                   static_cast<int64_t>(id_list.size()) * dim, false);
  for (float x : g.const_span()) {
    if (!std::isfinite(x)) {
      throw py::value_error(absl::StrCat("gradients of table ", table, " hold a NaN or Inf"));
    }
  }
  std::shared_ptr<const TableQueue::Call> call = table_queue_.Add(
      [this, table, id_list = std::move(id_list), grads = g.data(),
       clock](client::TableCallStats* stats) {
        return OnTables("push_sparse", [&](client::TableClient& client) {
          return client.Push(table, id_list, grads, clock, stats);
        });
      });
  return std::make_unique<TableCall>(std::move(call), std::move(g));
}

py::dict PyClient::Lookup(const std::string& table, py::handle ids, py::handle out, bool train,
                          int64_t clock) {
  return LookupAsync(table, ids, out, train, clock)->Wait();
}

py::dict PyClient::PushSparse(const std::string& table, py::handle ids, py::handle grads,
                              int64_t clock) {
  return PushSparseAsync(table, ids, grads, clock)->Wait();
}

int64_t PyClient::registered_worker_clock() {
  py::gil_scoped_release release;
  absl::ReaderMutexLock lock(&life_mu_);
  return client_ == nullptr ? 0 : client_->registered_worker_clock();
}

py::tuple PyClient::known_versions() {
  std::pair<int64_t, int64_t> versions{0, 0};
  {
    py::gil_scoped_release release;
    absl::ReaderMutexLock lock(&life_mu_);
    if (client_ != nullptr) versions = client_->known_versions();
  }
  return py::make_tuple(versions.first, versions.second);
}

bool PyClient::closed() {
  py::gil_scoped_release release;
  absl::ReaderMutexLock lock(&life_mu_);
  return client_ == nullptr;
}

int64_t PyClient::num_tensors() {
  py::gil_scoped_release release;
  absl::MutexLock lock(&data_mu_);
  return static_cast<int64_t>(tensors_.size());
}

}  // namespace shardtrain::python
