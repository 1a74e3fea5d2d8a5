// ps-worker: one trainer of a shardtrain job.
//
//   ps-worker --servers=127.0.0.1:7000,127.0.0.1:7001 --worker_index=0
//             --num_workers=2 --model=mlp:784-256-128-10 --epochs=10
//   # replicated shards (each partition on 2 of the 3 shards):
//   ps-worker --servers=a:7000,b:7000,c:7000 --replicas=2
//             --etcd_endpoints=etcd:2379 --job=mnist ...
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "app/buffer_pool_flag.h"
#include "app/client_security_flags.h"
#include "app/deadlock_detection.h"
#include "app/etcd_flags.h"
#include "app/flags_usage.h"
#include "app/malloc_tuning.h"
#include "client/ps_client_metrics.h"
#include "client/ps_client.h"
#include "client/ps_client_options.h"
#include "common/atomic_file.h"
#include "common/metrics_exposer.h"
#include "common/rpc_metrics.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "wire/buffer_pool_metrics.h"
#include "worker/data/dataset.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/device/device_options.h"
#include "worker/model/model_factory.h"
#include "worker/model/pipeline/schedule.h"
#include "worker/results.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated shard addresses host:port, in shard-index order");
ABSL_FLAG(int, worker_index, 0, "This worker's index in [0, num_workers)");
ABSL_FLAG(int, num_workers, 1, "Workers in the job");
ABSL_FLAG(std::string, model, "mlp:784-256-128-10", "Model spec");
ABSL_FLAG(int, batch, 64, "Examples per step on this worker");
ABSL_FLAG(int, epochs, 10, "Passes over this worker's share of the data");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial parameters and data order");
ABSL_FLAG(std::string, data_dir, shardtrain::worker::kDefaultFashionMnistDir,
          "Directory with the Fashion-MNIST IDX files");
ABSL_FLAG(int, max_train_examples, -1, "Use only this many training examples");
ABSL_FLAG(int, max_test_examples, -1, "Use only this many test examples");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(int, cpu_threads, 1, "OpenBLAS threads for the cpu device");
ABSL_FLAG(std::string, gemm_precision, "fp32",
          "GEMM compute on cuda: fp32, tf32 or bf16 (tensor cores, fp32 "
          "accumulation)");
ABSL_FLAG(std::string, wire_dtype, "f32", "Dtype on the wire: f32, f16 or bf16");
ABSL_FLAG(double, topk_ratio, 0,
          "0: push gradients dense; in (0, 1]: push only this fraction of each "
          "partition's largest entries, carrying the rest to the next step "
          "(top-k with error feedback)");
ABSL_FLAG(int64_t, max_partition_elements,
          shardtrain::common::kDefaultMaxPartitionElements,
          "Largest partition in elements; must match the shards'");
ABSL_FLAG(int, pipeline_stages, 1,
          "Split the model into this many contiguous stages, one device each");
ABSL_FLAG(int, microbatches, 1, "Microbatches per batch when pipelined");
ABSL_FLAG(std::string, schedule, "1f1b", "Pipeline schedule: gpipe or 1f1b");
ABSL_FLAG(std::string, overlap, "auto",
          "on: push each layer's gradient as backward produces it and prefetch "
          "the next step's parameters behind it; off: pull, compute, push in "
          "turn; auto: on for cuda, off for cpu (where compute and "
          "communication compete for the same cores); stale (async only): "
          "a step's push and pull run behind the next step's compute, which "
          "uses parameters one step older");
ABSL_FLAG(bool, chief, false,
          "Evaluate at epoch ends and report; default: worker 0 is the chief");
ABSL_FLAG(std::string, results, "", "Chief: write the results JSON here");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address host:port; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "", "If set, write the metrics port here");
ABSL_FLAG(double, rpc_timeout_s, 30, "Deadline of push/register RPCs");
ABSL_FLAG(double, pull_timeout_s, 300, "Deadline of a pull (it may wait)");
ABSL_FLAG(double, reconnect_timeout_s, 120,
          "Retry an RPC whose shard cannot be reached (or restarted) for this "
          "long after its first failure, then fail; per-attempt deadlines stay "
          "--rpc_timeout_s / --pull_timeout_s");
ABSL_FLAG(double, keepalive_s, 10,
          "HTTP/2 keepalive ping interval and ping timeout, so a dead shard or "
          "a cut link is noticed; 0 turns pings off (the shards must permit "
          "pings this often)");
ABSL_FLAG(double, wait_for_workers_s, 600,
          "Chief: how long to wait for the other workers after the last epoch "
          "before failing");
ABSL_FLAG(int, max_message_mb, 256, "Largest gRPC message in MiB");
ABSL_FLAG(bool, use_data_port, true,
          "Send Push, Pull and PushPull to a shard's data port (ps-server --data_listen: "
          "frames on plain TCP, no HTTP/2) when it has one; false: always gRPC");
ABSL_FLAG(int, channels_per_shard, 4,
          "TCP connections to each shard; a push's or pull's partitions on one "
          "shard are split over them");
ABSL_FLAG(int, replicas, 1,
          "Copies of every partition on a chain of shards (1..3, at most the "
          "number of shards); must match the shards' --replicas. 1: no "
          "replication, no etcd");
ABSL_FLAG(double, linger_s, 0,
          "Keep serving metrics this long after training, so a last scrape "
          "sees the final values");

namespace {

using namespace shardtrain;  // NOLINT: a binary's main file

// Parses the value of flag --`flag` with `parse` (one of the Parse*
// functions above or in the libraries); an error names the flag:
// "--device must be cpu or cuda, got tpu".
template <typename Parse>
auto ParseFlag(absl::string_view flag, absl::string_view value, Parse parse)
    -> decltype(parse(value)) {
  auto parsed = parse(value);
  if (parsed.ok()) return parsed;
  return absl::Status(parsed.status().code(),
                      absl::StrCat("--", flag, " ", parsed.status().message()));
}

// --overlap: "on", "off", or "auto" (on for cuda, off for cpu).
absl::StatusOr<bool> ParseOverlap(absl::string_view value,
                                  worker::DeviceKind device) {
  if (value == "on") return true;
  if (value == "off") return false;
  if (value == "auto") return device == worker::DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("must be auto, on, off or stale, got ", value));
}

absl::StatusOr<worker::ModelOptions> ModelOptionsFromFlags() {
  worker::ModelOptions options;
  ASSIGN_OR_RETURN(options.spec,
                   worker::ModelSpec::Parse(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(options.device,
                   ParseFlag("device", absl::GetFlag(FLAGS_device),
                             worker::ParseDeviceKind));
  options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  ASSIGN_OR_RETURN(options.gemm_precision,
                   ParseFlag("gemm_precision", absl::GetFlag(FLAGS_gemm_precision),
                             worker::ParseGemmPrecision));
  options.pipeline_stages = absl::GetFlag(FLAGS_pipeline_stages);
  options.microbatches = absl::GetFlag(FLAGS_microbatches);
  ASSIGN_OR_RETURN(options.schedule,
                   ParseFlag("schedule", absl::GetFlag(FLAGS_schedule),
                             worker::pipeline::ParseScheduleKind));
  return options;
}

// Serves /metrics and, with --port_file, writes its port there.
absl::StatusOr<std::unique_ptr<common::MetricsExposer>> StartMetrics() {
  ASSIGN_OR_RETURN(auto exposer, common::MetricsExposer::Create(
                                     absl::GetFlag(FLAGS_metrics_listen)));
  exposer->AddCollectable(
      std::make_shared<wire::BufferPoolMetrics>(&wire::BufferPool::Default()));
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    RETURN_IF_ERROR(common::WriteFileAtomically(
        port_file, absl::StrCat(exposer->port(), "\n")));
  }
  return exposer;
}

// The ps-worker flag that sets a PsClientOptions field, for errors.
std::string FlagOf(absl::string_view field) {
  static const absl::flat_hash_map<absl::string_view, absl::string_view> kOtherNames = {
      {"rpc_timeout", "rpc_timeout_s"},
      {"pull_timeout", "pull_timeout_s"},
      {"reconnect_timeout", "reconnect_timeout_s"},
      {"keepalive_time", "keepalive_s"},
      {"keepalive_timeout", "keepalive_s"},
      {"max_message_bytes", "max_message_mb"}};
  for (absl::string_view fixed :
       {"initial_backoff", "max_backoff", "member_timeout"}) {  // no flag sets these
    if (field == fixed) return absl::StrCat("the client's ", field);
  }
  const auto it = kOtherNames.find(field);
  return absl::StrCat("--", it == kOtherNames.end() ? field : it->second);
}

absl::StatusOr<client::PsClientOptions> ClientOptionsFromFlags() {
  client::PsClientOptions client_options;
  client_options.servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  // What a cast cannot carry is refused here; the ranges below.
  if (absl::GetFlag(FLAGS_worker_index) < 0) {
    return absl::InvalidArgumentError("--worker_index must be >= 0");
  }
  // The trainer needs a worker count; the client alone would take 0.
  if (absl::GetFlag(FLAGS_num_workers) < 1) {
    return absl::InvalidArgumentError("--num_workers must be >= 1");
  }
  const int max_message_mb = absl::GetFlag(FLAGS_max_message_mb);
  if (max_message_mb < 1 || max_message_mb > client::kMaxMessageMb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_mb must be in [1, ", client::kMaxMessageMb, "], got ", max_message_mb));
  }
  client_options.worker_index = static_cast<uint32_t>(absl::GetFlag(FLAGS_worker_index));
  client_options.num_workers = static_cast<uint32_t>(absl::GetFlag(FLAGS_num_workers));
  client_options.reconnect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_reconnect_timeout_s));
  client_options.keepalive_time = absl::Seconds(absl::GetFlag(FLAGS_keepalive_s));
  client_options.keepalive_timeout = client_options.keepalive_time;
  client_options.max_partition_elements = absl::GetFlag(FLAGS_max_partition_elements);
  ASSIGN_OR_RETURN(client_options.wire_dtype,
                   ParseFlag("wire_dtype", absl::GetFlag(FLAGS_wire_dtype), common::ParseDTypeName));
  client_options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  client_options.pull_timeout = absl::Seconds(absl::GetFlag(FLAGS_pull_timeout_s));
  client_options.max_message_bytes = max_message_mb << 20;
  client_options.security = app::ClientSecurityFromFlags();
  client_options.topk_ratio = absl::GetFlag(FLAGS_topk_ratio);
  client_options.channels_per_shard = absl::GetFlag(FLAGS_channels_per_shard);
  client_options.use_data_port = absl::GetFlag(FLAGS_use_data_port);
  client_options.replicas = absl::GetFlag(FLAGS_replicas);
  // The trainer's overlapped backward exchanges every tensor every step.
  client_options.exchanges_cover_every_tensor = true;
  const app::EtcdFlags etcd = app::EtcdFromFlags();
  client_options.etcd_endpoints = etcd.endpoints;
  client_options.job = etcd.job;
  RETURN_IF_ERROR(client::ValidatePsClientOptions(client_options, FlagOf));
  if (client_options.replicas > 1) {
    ASSIGN_OR_RETURN(client_options.etcd_credentials,
                     common::MakeEtcdCredentials(etcd.security));
  }
  return client_options;
}

// Each server must be the shard its place in --servers says. `shards` are
// the answers in shard order of every shard but those in `unreachable`
// (replicated shards: dead ones are skipped).
absl::Status CheckShardOrder(const std::vector<StatusResponse>& shards,
                             const std::vector<int>& unreachable,
                             const std::vector<std::string>& servers) {
  size_t next = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    if (std::find(unreachable.begin(), unreachable.end(), static_cast<int>(s)) !=
        unreachable.end()) {
      continue;
    }
    if (next >= shards.size()) break;
    const StatusResponse& shard = shards[next++];
    if (shard.shard() != s || shard.num_shards() != servers.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", servers[s], " is shard ", shard.shard(), " of ", shard.num_shards(),
          ", but is listed as shard ", s, " of ", servers.size()));
    }
  }
  return absl::OkStatus();
}

// `shard` is any shard's status: the shards own the consistency mode.
absl::StatusOr<worker::TrainerOptions> TrainerOptionsFromFlags(
    const StatusResponse& shard, worker::DeviceKind device) {
  worker::TrainerOptions options;
  options.worker_index = static_cast<uint32_t>(absl::GetFlag(FLAGS_worker_index));
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.sync = shard.mode() == "sync";
  options.batch = absl::GetFlag(FLAGS_batch);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.chief = absl::GetFlag(FLAGS_chief) || options.worker_index == 0;
  options.wait_for_workers = absl::Seconds(absl::GetFlag(FLAGS_wait_for_workers_s));
  if (absl::GetFlag(FLAGS_overlap) == "stale") {
    if (options.sync) {
      return absl::InvalidArgumentError(
          "--overlap=stale needs async shards (--mode=async): a sync step needs the "
          "parameters of its own step");
    }
    options.overlap = false;
    options.stale_overlap = true;
    return options;
  }
  ASSIGN_OR_RETURN(options.overlap,
                   ParseFlag("overlap", absl::GetFlag(FLAGS_overlap),
                             [device](absl::string_view value) {
                               return ParseOverlap(value, device);
                             }));
  return options;
}

// The training set, and the test set when this worker is the chief.
struct TrainingData {
  worker::Dataset train;
  worker::Dataset test;
};

absl::StatusOr<TrainingData> LoadTrainingData(bool chief) {
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  TrainingData data;
  ASSIGN_OR_RETURN(data.train,
                   worker::LoadFashionMnist(data_dir, /*train=*/true,
                                            absl::GetFlag(FLAGS_max_train_examples)));
  if (chief) {
    ASSIGN_OR_RETURN(data.test, worker::LoadFashionMnist(
                                    data_dir, /*train=*/false,
                                    absl::GetFlag(FLAGS_max_test_examples)));
  }
  return data;
}

// "worker 0/2 training mlp:... on cpu in 2 stages x 4 microbatches (1f1b)
// (sync, 2 shards, optimizer sgd)".
std::string DescribeRun(const worker::TrainerOptions& options,
                        const worker::ModelOptions& model_options,
                        const std::vector<StatusResponse>& shards,
                        const client::PsClientOptions& client_options) {
  std::string pipeline;
  if (model_options.pipeline_stages > 1) {
    pipeline = absl::StrCat(
        " in ", model_options.pipeline_stages, " stages x ",
        model_options.microbatches, " microbatches (",
        worker::pipeline::ScheduleKindName(model_options.schedule), ")");
  }
  return absl::StrCat("worker ", options.worker_index, "/", options.num_workers,
                      " training ", model_options.spec.ToString(), " on ",
                      worker::DeviceKindName(model_options.device), pipeline,
                      " (", shards[0].mode(), ", ", client_options.servers.size(),
                      " shards, ",
                      client_options.replicas > 1
                          ? absl::StrCat(client_options.replicas, " replicas, ")
                          : "",
                      "optimizer ", shards[0].optimizer(), ")");
}

// The chief's report: the final accuracy on stdout and, with --results, the
// results file.
absl::Status ReportResults(const worker::TrainerOptions& options,
                           const worker::ModelSpec& spec,
                           const std::vector<StatusResponse>& shards, int num_shards,
                           const worker::TrainResult& result) {
  std::cout << absl::StrFormat("final test accuracy: %.4f",
                               result.final_test_accuracy)
            << std::endl;
  const std::string results = absl::GetFlag(FLAGS_results);
  if (results.empty()) return absl::OkStatus();
  worker::RunDescription run;
  run.mode = shards[0].mode();
  run.model = spec.ToString();
  run.optimizer = shards[0].optimizer();
  run.workers = options.num_workers;
  run.shards = num_shards;
  run.batch = options.batch;
  run.epochs = options.epochs;
  return worker::WriteResults(results, run, result);
}

absl::Status RunWorker() {
  ASSIGN_OR_RETURN(const worker::ModelOptions model_options, ModelOptionsFromFlags());
  ASSIGN_OR_RETURN(worker::ModelFactory make_model,
                   worker::MakeModelFactory(model_options));
  ASSIGN_OR_RETURN(auto exposer, StartMetrics());
  common::RpcMetrics rpc_metrics(exposer->registry(), "client");
  worker::WorkerMetrics worker_metrics(exposer->registry());
  client::PsClientMetrics client_metrics(exposer->registry());
  ASSIGN_OR_RETURN(const client::PsClientOptions client_options,
                   ClientOptionsFromFlags());
  ASSIGN_OR_RETURN(auto client, client::PsClient::Create(client_options, &rpc_metrics,
                                                         &client_metrics));
  // The shards own the consistency mode; ask rather than trust a flag.
  std::vector<int> unreachable;
  ASSIGN_OR_RETURN(std::vector<StatusResponse> shards, client->ClusterStatus(&unreachable));
  RETURN_IF_ERROR(CheckShardOrder(shards, unreachable, client_options.servers));
  ASSIGN_OR_RETURN(const worker::TrainerOptions options,
                   TrainerOptionsFromFlags(shards[0], model_options.device));
  ASSIGN_OR_RETURN(const TrainingData data, LoadTrainingData(options.chief));

  ASSIGN_OR_RETURN(auto trainer,
                   worker::Trainer::Create(options, make_model, client.get(),
                                           &worker_metrics));
  RETURN_IF_ERROR(trainer->Initialize());
  LOG(INFO) << DescribeRun(options, model_options, shards, client_options)
            << ", metrics on port "
            << exposer->port();
  if (model_options.device == worker::DeviceKind::kCpu) {
    LOG(INFO) << "OpenBLAS kernels: " << worker::CpuMathKernels();
  }
  ASSIGN_OR_RETURN(
      worker::TrainResult result,
      trainer->Run(data.train, options.chief ? &data.test : nullptr,
                   [&](const worker::EpochResult& epoch) {
                     if (options.chief) {
                       std::cout << worker::FormatEpoch(epoch, options.epochs)
                                 << std::endl;
                     }
                   }));
  if (options.chief) {
    RETURN_IF_ERROR(ReportResults(options, model_options.spec, shards,
                                  static_cast<int>(client_options.servers.size()), result));
  }
  LOG(INFO) << "worker " << options.worker_index << " finished "
            << result.steps << " steps in " << result.wall_seconds << " s";
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_linger_s)));
  return absl::OkStatus();
}

}  // namespace

#ifdef SHARDTRAIN_WORKER_CUDA_BINARY
namespace {
// This ps-worker is the CPU-only half of a CUDA build: --device=cuda runs
// the CUDA worker installed beside it with the same arguments (the process
// keeps its PID). Returns only on failure, with a message saying what to
// install.
int ExecCudaWorker(char** argv) {
  std::error_code error;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", error);
  const std::filesystem::path cuda_worker =
      (error ? std::filesystem::path(argv[0]) : self).parent_path() /
      SHARDTRAIN_WORKER_CUDA_BINARY;
  execv(cuda_worker.c_str(), argv);
  const int exec_errno = errno;
  std::cerr << "ps-worker: --device=cuda needs " << cuda_worker.string() << ": "
            << std::strerror(exec_errno)
            << (exec_errno == ENOENT
                    ? " (it is in the shardtrain-cuda package; this one trains "
                      "on --device=cpu)"
                    : "")
            << "\n";
  return 1;
}
}  // namespace
#endif

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  shardtrain::app::ParseFlags(argc, argv, "One trainer of a shardtrain job.");
#ifdef SHARDTRAIN_WORKER_CUDA_BINARY
  if (absl::GetFlag(FLAGS_device) == "cuda") return ExecCudaWorker(argv);
#endif
  shardtrain::app::KeepLargeBuffersInHeap();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (const absl::Status pool = shardtrain::app::ApplyBufferPoolFlag(); !pool.ok()) {
    LOG(ERROR) << pool;
    return 2;
  }
  const absl::Status status = RunWorker();
  if (!status.ok()) {
    LOG(ERROR) << "worker failed: " << status;
    return 1;
  }
  return 0;
}
