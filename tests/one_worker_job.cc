#include "tests/one_worker_job.h"

#include <random>
#include <string>
#include <utility>

#include "common/status_macros.h"
#include "server/ps_server.h"
#include "tests/in_process_shards.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"

namespace shardtrain::testutil {

absl::StatusOr<OneWorkerResult> RunOneWorkerJob(const OneWorkerJob& job) {
  constexpr int kFeatures = 30;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(job.steps) * job.batch * kFeatures);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> labels(size_t(job.steps) * job.batch);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 4);

  server::ShardOptions shard_options;
  shard_options.partitioning.max_partition_elements = job.partition_elements;
  shard_options.mode = server::ConsistencyMode::kSync;
  shard_options.num_workers = 1;
  shard_options.optimizer.name = "momentum";
  shard_options.optimizer.learning_rate = 0.05f;
  ASSIGN_OR_RETURN(testutil::InProcessShards cluster,
                   testutil::StartInProcessShards(shard_options, job.shards));
  client::PsClientOptions client_options = job.client;
  client_options.servers = cluster.addresses;
  client_options.max_partition_elements = job.partition_elements;
  client_options.pull_timeout = absl::Seconds(30);
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> client,
                   client::PsClient::Create(client_options, job.rpc_metrics));

  std::unique_ptr<worker::Backend> backend = worker::MakeCpuBackend();
  const worker::ModelSpec spec = worker::ModelSpec::Parse("mlp:30-20-12-4").value();
  worker::ModelFactory make_model =
      [&](int max_batch) -> absl::StatusOr<std::unique_ptr<worker::Model>> {
    ASSIGN_OR_RETURN(std::unique_ptr<worker::Mlp> mlp,
                     worker::Mlp::Create(spec, backend.get(), max_batch));
    std::unique_ptr<worker::Model> model = std::move(mlp);
    return job.wrap_model ? job.wrap_model(std::move(model)) : std::move(model);
  };
  worker::TrainerOptions options;
  options.sync = true;
  options.overlap = job.overlap;
  options.batch = job.batch;
  ASSIGN_OR_RETURN(std::unique_ptr<worker::Trainer> trainer,
                   worker::Trainer::Create(options, make_model, client.get(), nullptr));
  RETURN_IF_ERROR(trainer->Initialize());
  OneWorkerResult result;
  for (int step = 0; step < job.steps; ++step) {
    ASSIGN_OR_RETURN(float loss,
                     trainer->Step(&x[size_t(kFeatures) * job.batch * step],
                                   &labels[size_t(job.batch) * step], job.batch));
    result.losses.push_back(loss);
  }
  RETURN_IF_ERROR(trainer->PullParameters(job.steps));
  result.params = trainer->params();
  return result;
}

}  // namespace shardtrain::testutil
