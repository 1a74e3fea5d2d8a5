// Trainer: the training loop of one worker.
//
// Each step pulls the parameters, computes a gradient on the worker's next
// batch and pushes it:
//  - sync: step t pulls version t (waiting for the shards to average step
//    t-1 from every worker) and pushes its gradient for step t;
//  - async: a step pulls whatever is current, subject to the staleness
//    bound the shards enforce on this worker's clock.
// Faults. Initialize learns where the job is (sync: the shards' step, which
// every partition's version equals; async: the largest clock any shard
// recorded for this worker index), so a restarted worker resumes at that
// step with the data position of a run that never stopped: epoch =
// clock / steps_per_epoch + 1, batch = clock % steps_per_epoch. Run trains
// until clock = epochs * steps_per_epoch. In sync mode a gradient refused as
// late (the shards dropped this worker while it stalled) is discarded: the
// worker pulls the current step's parameters and rejoins there; so does a
// worker whose pull (blocking or overlapped) returns a later step than its
// own (it was dropped and the others went on).
// A background thread sends heartbeats. The chief worker also evaluates
// test accuracy at each epoch end and, after the last epoch, waits for the
// other workers to finish before the final evaluation.
//
// Thread-compatible: one thread calls Step/Run.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
//                    Trainer::Create(options, make_model, client, &metrics));
//   RETURN_IF_ERROR(trainer->Initialize());
//   ASSIGN_OR_RETURN(TrainResult result, trainer->Run(train, &test, nullptr));
#ifndef SHARDTRAIN_WORKER_TRAINER_H_
#define SHARDTRAIN_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/parameter_client.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"
#include "worker/worker_metrics.h"

namespace shardtrain::worker {

class DataShard;

class ExchangeThread;
class HeartbeatThread;

struct TrainerOptions {
  uint32_t worker_index = 0;
  int num_workers = 1;
  // Must match the shards' --mode.
  bool sync = false;
  int batch = 64;
  int epochs = 10;
  // Seeds the parameter initialisation and the data order.
  uint64_t seed = 1;
  // Evaluate test accuracy at epoch ends and wait for the others at the end.
  bool chief = false;
  int eval_batch = 1000;
  // Push each layer's gradient as soon as backward produces it and fetch
  // the next step's parameters behind it (see client/tensor_exchange.h);
  // otherwise push everything after backward and pull before the next step.
  bool overlap = true;
  // Async only, without overlap: the push and pull of step t run on a
  // thread of their own behind step t+1's compute, which uses the
  // parameters the exchange before fetched: one step older, without this
  // worker's last gradient (its staleness grows by one). On a CPU the
  // exchange then runs on another core instead of between computes. An
  // exchange's error ends the next step.
  bool stale_overlap = false;
  // Page-lock the host copy of the parameters for the model's copies
  // (Model::PinParamHost: on a GPU, DMA instead of a staged copy). Off only
  // to measure what that saves (step_bench --pageable).
  bool pin_params = true;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // How long the chief waits for the other workers after its last epoch.
  absl::Duration wait_for_workers = absl::Minutes(10);
};

struct EpochResult {
  int epoch = 0;  // 1-based
  double train_loss = 0;
  double test_accuracy = -1;  // -1 when not evaluated
  double seconds = 0;
  // All workers together when the chief can see their clocks, else this one.
  double samples_per_second = 0;
  double mean_staleness = 0;
  int64_t max_staleness = 0;
  double compute_seconds = 0, push_seconds = 0, pull_seconds = 0,
         wait_seconds = 0;
};

struct TrainResult {
  std::vector<EpochResult> epochs;
  double final_test_accuracy = -1;
  double wall_seconds = 0;
  double samples_per_second = 0;  // all workers
  int64_t steps = 0;              // run by this worker process
};

class Trainer {
 public:
  // `make_model` builds the training model (and the chief's evaluation
  // model); `client` and `metrics` are not owned and must outlive the
  // trainer; `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerOptions& options, const ModelFactory& make_model,
      client::ParameterClient* client, WorkerMetrics* metrics);
  ~Trainer();

  // Registers the model's tensors with the shards and sets clock() to
  // where the job is (see the file comment).
  absl::Status Initialize();

  // One training step on `batch` examples; returns the mean loss.
  absl::StatusOr<float> Step(const float* x, const int32_t* labels, int batch);

  // Pulls the current parameters (waiting for `min_version`) into params().
  absl::Status PullParameters(int64_t min_version);

  // Waits for overlapped exchanges still in flight (their parameters become
  // params() and feed the next step).
  absl::Status Drain();

  // Test accuracy of the current parameters on `test`.
  absl::StatusOr<double> Evaluate(const Dataset& test);

  // Trains from clock() to options.epochs epochs on this worker's share of
  // `train`; an epoch's result is reported when a step ends it. `test` is
  // needed by the chief only. `on_epoch` sees each epoch's result.
  absl::StatusOr<TrainResult> Run(
      const Dataset& train, const Dataset* test,
      const std::function<void(const EpochResult&)>& on_epoch);

  // Phase times summed since the current epoch began (or since creation when
  // Step is driven directly): compute, push, pull and wait fields only.
  EpochResult PhaseTotals() const;

  // Parameters as of the last pull, in model order.
  const std::vector<std::vector<float>>& params() const { return params_; }
  int64_t clock() const { return clock_.load(); }

 private:
  struct StepTimes;
  struct EpochTally;
  // What Run adds up over the whole run.
  struct RunTotals {
    TrainResult result;
    absl::Time start;
    int64_t steps_run = 0;
    // Chief: the job's steps (sum of the workers' clocks) when this run
    // started and when the last epoch ended.
    int64_t cluster_steps_at_start = 0;
    int64_t cluster_steps_before = 0;
    // Chief: the last epoch's evaluation saw the final model.
    bool final_evaluated = false;
  };

  // The phases of Run.
  // Starts `epoch` of the data shard at `step`: a fresh tally and fresh
  // phase times (an epoch left by a rejoin is logged, not reported).
  void BeginEpoch(int epoch, int64_t step, DataShard& shard, EpochTally& tally);
  // The result of the epoch that just ended; the chief measures the job's
  // throughput and evaluates (after the last epoch, once the others are done).
  absl::StatusOr<EpochResult> EndEpoch(const EpochTally& tally, const Dataset* test,
                                       RunTotals& totals);
  // After the last step: tells the shards this worker is done (the chief
  // waits for the others and evaluates if it has not yet) and fills the
  // result's totals.
  absl::Status FinishRun(const Dataset* test, RunTotals& totals);

  Trainer(const TrainerOptions& options, client::ParameterClient* client,
          WorkerMetrics* metrics, std::unique_ptr<Model> model);

  // The phases of Step, in order.
  // Gets this step's parameters into params_: from the exchanges the last
  // step started, or a pull now. Returns the step they are for (after a
  // rejoin, the shards' step). Adds what it measured to push and pull.
  absl::StatusOr<int64_t> FetchStepParameters(client::PushStats& push,
                                              client::PullStats& pull);
  // What an exchange that pushed for `step` and fetched its parameters
  // (a PushPull, or the overlapped exchanges) left the trainer with.
  enum class ExchangeOutcome {
    kFetched,     // params_ hold step's parameters
    kRejoined,    // the worker rejoined at the shards' step (sync)
    kPullNeeded,  // the step goes on with an earlier push of it (sync)
  };
  // Acts on such an exchange's `status`: a late gradient rejoins,
  // ALREADY_EXISTS leaves params_ to be pulled, OK marks them ready (sync:
  // rejoining if they are of a later step); other errors are returned.
  absl::StatusOr<ExchangeOutcome> SettleExchange(const absl::Status& status, int64_t step);
  // Loads params_ into the model and runs forward and backward; with
  // overlap, each gradient's exchange for step + 1 starts as soon as
  // backward has produced it. Returns the mean loss.
  absl::StatusOr<float> Compute(const float* x, const int32_t* labels,
                                int batch, int64_t step);
  // Copies every gradient to the host: grad_spans_, until the next backward.
  absl::Status CopyGradsToHost();
  // Without overlap: copies every gradient to the host and pushes them for
  // step + 1 in one PushPull that also fetches step + 1's parameters (sync:
  // once the step is complete). Returns true if the push was refused as
  // late, or the parameters were of a later step, and the worker rejoined
  // at the shards' step.
  absl::StatusOr<bool> PushGradients(int64_t step, client::PushStats& push,
                                     client::PullStats& pull);
  // stale_overlap: lands the exchange in flight (its parameters become
  // params_), then copies this step's gradients to the host and starts
  // step + 1's exchange with them. Adds the landed exchange's figures to
  // push and pull.
  absl::Status ExchangeBehind(int64_t step, client::PushStats& push, client::PullStats& pull);
  // stale_overlap: waits for the exchange in flight, if any, and makes the
  // parameters it fetched params_.
  absl::Status LandExchange(client::PushStats* push, client::PullStats* pull);
  bool exchange_in_flight() const;
  // Adds the step's phase times to the epoch totals and the metrics.
  void RecordStep(const StepTimes& times, const client::PushStats& push,
                  const client::PullStats& pull, int batch, float loss);

  void StartHeartbeats();
  void StopHeartbeats();
  // Sum of every worker's clock as the shards see it.
  absl::StatusOr<int64_t> ClusterSteps();
  absl::Status WaitForOtherWorkers();
  // Sync: a push refused because its step had finished without it.
  bool IsLateGradient(const absl::Status& status) const;
  // Sync: pulls until every partition has the same version (pulling first
  // when `pull_first`, else starting from the versions already known) and
  // returns it: the step the job is at.
  absl::StatusOr<int64_t> SyncToShardStep(bool pull_first);
  // SyncToShardStep when the partitions, just pulled, are more than a step
  // apart ([lo, hi]): makes the newest step the job's.
  absl::StatusOr<int64_t> CatchUpLaggingPartitions(int64_t lo, int64_t hi);
  // Sync: moves clock_ to the shards' step, with its parameters in
  // params_, after this worker fell behind (`why`: its gradient was refused
  // as late, or a pull returned a later step). Pulls first when
  // `pull_first`, else starts from the versions the last pull returned.
  absl::Status Rejoin(const absl::Status& why, bool pull_first = true);
  // Sync: checks that the parameters just fetched are those of `step`. If
  // the shards are past it (they went on without this worker while it was
  // dropped), rejoins at their step and returns true.
  absl::StatusOr<bool> RejoinIfAhead(int64_t step);

  const TrainerOptions options_;
  client::ParameterClient* const client_;
  WorkerMetrics* const metrics_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> eval_model_;

  std::vector<std::vector<float>> params_;
  std::vector<absl::Span<float>> param_spans_;
  // params_ page-locked for the model's copies (Model::PinParamHost); after
  // params_, so they are released first.
  std::vector<std::unique_ptr<HostPin>> param_pins_;
  // This step's gradients, in host memory the model owns (CopyGradsToHost).
  // With stale_overlap, also what the exchange in flight sends: the next
  // copy waits for it to land.
  std::vector<absl::Span<const float>> grad_spans_;
  std::atomic<int64_t> clock_{0};
  // Exchanges of the last step are in flight; their pulls are the next
  // step's parameters.
  bool exchanges_pending_ = false;
  // params_ already hold what the next step needs.
  bool params_ready_ = false;
  // stale_overlap: where the exchange started after the last step's
  // compute fetches to (params_'s twin, swapped with it as an exchange
  // lands; it sends grad_spans_), and the thread that makes it (after the
  // buffers, so it is gone before them).
  std::vector<std::vector<float>> next_params_;
  std::vector<absl::Span<float>> next_param_spans_;
  std::unique_ptr<ExchangeThread> exchange_;
  // The versions of the parameters in params_ (what the next push says its
  // gradients were computed at).
  std::vector<int64_t> params_versions_;

  // Totals of the current epoch.
  double compute_seconds_ = 0, push_seconds_ = 0, pull_seconds_ = 0,
         wait_seconds_ = 0, staleness_sum_ = 0;
  int64_t max_staleness_ = 0;
  double smoothed_rate_ = 0;

  std::unique_ptr<HeartbeatThread> heartbeats_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_TRAINER_H_
