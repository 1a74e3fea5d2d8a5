#include "worker/trainer.h"

#include <algorithm>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/float_env.h"
#include "common/status_macros.h"
#include "worker/data/data_shard.h"
#include "worker/exchange_thread.h"
#include "worker/model/tensor_specs.h"

namespace shardtrain::worker {

// Sends a heartbeat with the trainer's clock every interval until stopped.
class HeartbeatThread {
 public:
  HeartbeatThread(client::ParameterClient* client, const std::atomic<int64_t>* clock,
                  absl::Duration interval)
      : thread_([this, client, clock, interval] {
          while (!stop_.WaitForNotificationWithTimeout(interval)) {
            // Bounded, so stopping never waits long; the next beat retries.
            absl::StatusOr<HeartbeatResponse> sent = client->Heartbeat(
                clock->load(), /*done=*/false, std::max(3 * interval, absl::Seconds(1)));
            if (!sent.ok()) LOG(WARNING) << "heartbeat failed: " << sent.status();
          }
        }) {}
  ~HeartbeatThread() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

Trainer::Trainer(const TrainerOptions& options, client::ParameterClient* client,
                 WorkerMetrics* metrics, std::unique_ptr<Model> model)
    : options_(options),
      client_(client),
      metrics_(metrics),
      model_(std::move(model)) {}

Trainer::~Trainer() {
  StopHeartbeats();
  // In-flight pulls write into params_: they must land before it goes.
  const absl::Status drained = Drain();
  if (!drained.ok()) LOG(WARNING) << "exchanges failed at shutdown: " << drained;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerOptions& options, const ModelFactory& make_model,
    client::ParameterClient* client, WorkerMetrics* metrics) {
  if (options.num_workers < 1 ||
      options.worker_index >= static_cast<uint32_t>(options.num_workers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker index %d is not in [0, %d)", options.worker_index,
        options.num_workers));
  }
  if (options.batch < 1 || options.epochs < 0 || options.eval_batch < 1) {
    return absl::InvalidArgumentError("batch and eval_batch must be >= 1, epochs >= 0");
  }
  if (options.stale_overlap && (options.sync || options.overlap)) {
    return absl::InvalidArgumentError(
        "stale overlap (parameters one step older) is for async mode without overlap; "
        "sync steps need the parameters of their own step");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, make_model(options.batch));
  std::unique_ptr<Trainer> trainer(
      new Trainer(options, client, metrics, std::move(model)));
  if (options.chief) {
    ASSIGN_OR_RETURN(trainer->eval_model_, make_model(options.eval_batch));
  }
  for (const ParamInfo& param : trainer->model_->params()) {
    trainer->params_.emplace_back(NumElements(param), 0.0f);
  }
  for (std::vector<float>& param : trainer->params_) {
    trainer->param_spans_.push_back(absl::MakeSpan(param));
  }
  // Every step copies params_ into the model: on a GPU, page-locked memory
  // makes that a DMA at the bus's speed instead of a staged copy.
  for (size_t i = 0; options.pin_params && i < trainer->param_spans_.size(); ++i) {
    absl::StatusOr<std::unique_ptr<HostPin>> pin =
        trainer->model_->PinParamHost(static_cast<int>(i), trainer->param_spans_[i]);
    if (!pin.ok()) {
      LOG(WARNING) << "parameters stay in pageable host memory (slower copies to the "
                      "device): " << pin.status();
      trainer->param_pins_.clear();
      break;
    }
    trainer->param_pins_.push_back(std::move(pin).value());
  }
  trainer->grad_spans_.resize(trainer->params_.size());
  if (options.stale_overlap) {
    trainer->next_params_ = trainer->params_;
    for (std::vector<float>& param : trainer->next_params_) {
      trainer->next_param_spans_.push_back(absl::MakeSpan(param));
    }
    trainer->exchange_ = std::make_unique<ExchangeThread>(client);
  }
  return trainer;
}

namespace {

// Sync: pulls that may be needed for every partition to agree on the step.
constexpr int kMaxSyncPulls = 1000;

}  // namespace

absl::Status Trainer::Initialize() {
  common::EnableFlushToZero();
  client_->set_sync_mode(options_.sync);
  RETURN_IF_ERROR(client_->Register(TensorSpecsFor(model_->params(), options_.seed)));
  params_ready_ = false;  // SyncToShardStep may pull them
  int64_t clock = 0;
  if (options_.sync) {
    ASSIGN_OR_RETURN(clock, SyncToShardStep(/*pull_first=*/false));
  } else {
    clock = client_->registered_worker_clock();
  }
  clock_.store(clock);
  return absl::OkStatus();
}

bool Trainer::IsLateGradient(const absl::Status& status) const {
  return options_.sync && status.code() == absl::StatusCode::kFailedPrecondition;
}

absl::StatusOr<int64_t> Trainer::SyncToShardStep(bool pull_first) {
  client::PullStats stats;
  if (pull_first) {
    RETURN_IF_ERROR(client_->Pull(clock_.load(), 0, param_spans_, &stats));
  }
  for (int i = 0; i < kMaxSyncPulls; ++i) {
    const auto [lo, hi] = client_->known_versions();
    if (lo == hi) return hi;
    if (hi - lo > 1) {
      // This worker's versions may only be old (it was away): see what the
      // partitions hold now before taking them for apart.
      RETURN_IF_ERROR(client_->Pull(hi, /*min_version=*/0, param_spans_, &stats));
      const auto [now_lo, now_hi] = client_->known_versions();
      if (now_hi - now_lo > 1) return CatchUpLaggingPartitions(now_lo, now_hi);
      continue;
    }
    // Some partitions are a step ahead: wait for the rest to get there.
    RETURN_IF_ERROR(client_->Pull(hi, hi, param_spans_, &stats));
  }
  const auto [lo, hi] = client_->known_versions();
  return absl::UnavailableError(absl::StrFormat(
      "partition versions still range over [%d, %d] after %d pulls", lo, hi,
      kMaxSyncPulls));
}

absl::StatusOr<int64_t> Trainer::CatchUpLaggingPartitions(int64_t lo, int64_t hi) {
  // Their shards restored an older step checkpoint than the others (the
  // whole job was killed between the shards' checkpoint writes): the job
  // goes on at the newest step, from the parameters they hold, and they
  // catch up on the next push, as after one shard's restart.
  const int64_t lost = client_->RaiseKnownVersions(hi);
  params_ready_ = true;
  LOG(WARNING) << "sync: partitions at steps [" << lo << ", " << hi
               << "]: those behind restored an older step checkpoint than the rest; going on "
               << "at step " << hi << " from what they hold (" << lost
               << " partition-steps lost)";
  return hi;
}

absl::Status Trainer::Rejoin(const absl::Status& why, bool pull_first) {
  const int64_t was = clock_.load();
  ASSIGN_OR_RETURN(const int64_t step, SyncToShardStep(pull_first));
  clock_.store(step);
  params_ready_ = true;
  if (metrics_ != nullptr) metrics_->rejoins().Increment();
  LOG(WARNING) << "worker " << options_.worker_index << " rejoined at step " << step
               << " (was at " << was << "): " << why.message();
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::RejoinIfAhead(int64_t step) {
  const auto [lo, hi] = client_->known_versions();
  if (lo == step && hi == step) return false;
  if (lo < step) {
    return absl::InternalError(absl::StrFormat(
        "sync step %d received parameters of versions [%d, %d]", step, lo, hi));
  }
  RETURN_IF_ERROR(Rejoin(
      absl::AbortedError(absl::StrFormat(
          "sync step %d received parameters of versions [%d, %d]: the shards "
          "went on without this worker",
          step, lo, hi)),
      /*pull_first=*/false));
  return true;
}

absl::Status Trainer::PullParameters(int64_t min_version) {
  RETURN_IF_ERROR(Drain());
  client::PullStats stats;
  RETURN_IF_ERROR(client_->Pull(clock_.load(), min_version, param_spans_, &stats));
  params_ready_ = !options_.sync || min_version == clock_.load();
  return absl::OkStatus();
}

absl::Status Trainer::Drain() {
  if (exchange_in_flight()) {
    params_ready_ = false;  // pulled afresh if the exchange failed
    RETURN_IF_ERROR(LandExchange(nullptr, nullptr));
    params_ready_ = true;
  }
  if (!exchanges_pending_) return absl::OkStatus();
  exchanges_pending_ = false;
  client::PushStats push;
  client::PullStats pull;
  // The exchanges pulled what the next step needs (in sync mode, the
  // version of the step they pushed for, or a later one after a rejoin).
  return SettleExchange(client_->FinishExchanges(&push, &pull), clock_.load()).status();
}

// When each phase of a step ended.
struct Trainer::StepTimes {
  absl::Time start;
  absl::Time pulled;
  absl::Time computed;
  absl::Time pushed;
};

absl::StatusOr<float> Trainer::Step(const float* x, const int32_t* labels,
                                    int batch) {
  StepTimes times;
  times.start = absl::Now();
  client::PushStats push;
  client::PullStats pull;
  ASSIGN_OR_RETURN(const int64_t step, FetchStepParameters(push, pull));
  // Stale overlap: params_ came from a pull, or from the exchange that
  // landed last (see LandExchange); with one in flight, nothing pulled since.
  if (options_.stale_overlap && !exchange_in_flight()) params_versions_ = client_->PulledVersions();
  times.pulled = absl::Now();
  ASSIGN_OR_RETURN(const float loss, Compute(x, labels, batch, step));
  times.computed = absl::Now();
  bool rejoined = false;
  if (options_.stale_overlap) {
    RETURN_IF_ERROR(ExchangeBehind(step, push, pull));
  } else if (!options_.overlap) {
    ASSIGN_OR_RETURN(rejoined, PushGradients(step, push, pull));
  }
  times.pushed = absl::Now();
  if (!rejoined) clock_.store(step + 1);
  RecordStep(times, push, pull, batch, loss);
  return loss;
}

absl::StatusOr<int64_t> Trainer::FetchStepParameters(client::PushStats& push,
                                                     client::PullStats& pull) {
  if (exchanges_pending_) {
    exchanges_pending_ = false;
    const absl::Status finished = client_->FinishExchanges(&push, &pull);
    // A refused push's figures are not the step's.
    if (IsLateGradient(finished)) {
      push = client::PushStats();
      pull = client::PullStats();
    }
    RETURN_IF_ERROR(SettleExchange(finished, clock_.load()).status());
  }
  int64_t step = clock_.load();
  if (!params_ready_) {
    RETURN_IF_ERROR(client_->Pull(step, options_.sync ? step : 0, param_spans_, &pull));
    if (options_.sync) {
      // A later step: this worker was dropped (it stalled, or its link was
      // cut) and the others went on; it rejoins at their step.
      ASSIGN_OR_RETURN(const bool rejoined, RejoinIfAhead(step));
      if (rejoined) step = clock_.load();
    }
  }
  params_ready_ = false;
  return step;
}

absl::StatusOr<Trainer::ExchangeOutcome> Trainer::SettleExchange(const absl::Status& status,
                                                                 int64_t step) {
  if (IsLateGradient(status)) {
    RETURN_IF_ERROR(Rejoin(status));  // pulls the shards' step's parameters
    return ExchangeOutcome::kRejoined;
  }
  if (options_.sync && status.code() == absl::StatusCode::kAlreadyExists) {
    // A gradient for this step was pushed before (by this worker index's
    // previous process): the step goes on with it, and the next
    // FetchStepParameters pulls its result.
    LOG(INFO) << status.message() << "; continuing with it";
    params_ready_ = false;
    return ExchangeOutcome::kPullNeeded;
  }
  RETURN_IF_ERROR(status);
  params_ready_ = true;
  if (!options_.sync) return ExchangeOutcome::kFetched;
  // Parameters of a later step: this worker was dropped (it stalled, or
  // its link was cut) and the others went on; it rejoins at their step.
  ASSIGN_OR_RETURN(const bool rejoined, RejoinIfAhead(step));
  return rejoined ? ExchangeOutcome::kRejoined : ExchangeOutcome::kFetched;
}

absl::StatusOr<float> Trainer::Compute(const float* x, const int32_t* labels,
                                       int batch, int64_t step) {
  for (size_t i = 0; i < params_.size(); ++i) {
    RETURN_IF_ERROR(model_->SetParam(static_cast<int>(i), params_[i]));
  }
  absl::Status grad_status;
  std::function<void(int)> on_grad_ready;
  if (options_.overlap) {
    // The copy to the host runs beside the rest of backward (on a GPU, on
    // its own stream); the exchange's sender waits for it, then pushes.
    const int64_t next_min_version = options_.sync ? step + 1 : 0;
    on_grad_ready = [this, step, next_min_version, &grad_status](int i) {
      absl::StatusOr<PendingGrad> grad = model_->StartGradCopy(i);
      if (!grad.ok()) {
        if (grad_status.ok()) grad_status = grad.status();
        return;
      }
      client_->StartExchange(
          i, step + 1, next_min_version, grad->values,
          [ready = std::move(grad->ready)] { return ready->Wait(); }, param_spans_[i]);
    };
  }
  absl::StatusOr<float> loss = model_->ForwardBackward(x, labels, batch, on_grad_ready);
  if (!loss.ok() || !grad_status.ok()) {
    // Some tensors may have started their exchange and others not: wait for
    // those in flight (they use this step's buffers) and pull afresh next time.
    if (options_.overlap) {
      client::PushStats ignored_push;
      client::PullStats ignored_pull;
      (void)client_->FinishExchanges(&ignored_push, &ignored_pull);
    }
    return loss.ok() ? grad_status : loss.status();
  }
  if (options_.overlap) exchanges_pending_ = true;
  return *loss;
}

absl::Status Trainer::CopyGradsToHost() {
  std::vector<PendingGrad> grads;
  for (size_t i = 0; i < grad_spans_.size(); ++i) {
    ASSIGN_OR_RETURN(PendingGrad grad, model_->StartGradCopy(static_cast<int>(i)));
    grads.push_back(std::move(grad));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    RETURN_IF_ERROR(grads[i].ready->Wait());
    grad_spans_[i] = grads[i].values;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::PushGradients(int64_t step, client::PushStats& push,
                                             client::PullStats& pull) {
  RETURN_IF_ERROR(CopyGradsToHost());
  // The next step's parameters come back with the push: one round trip
  // instead of two. Async: they include this gradient, as a pull after the
  // push would. Sync: the pull half waits on each shard until the step is
  // complete (every worker's gradient is in) and brings its result; an
  // acknowledged push whose step's pull is still to come is what a
  // restarted shard would need replayed, and with both halves in one
  // answer there is none.
  const absl::Status exchanged =
      client_->PushPull(step + 1, /*min_version=*/options_.sync ? step + 1 : 0, grad_spans_,
                        param_spans_, &push, &pull);
  ASSIGN_OR_RETURN(const ExchangeOutcome outcome, SettleExchange(exchanged, step + 1));
  return outcome == ExchangeOutcome::kRejoined;
}

absl::Status Trainer::ExchangeBehind(int64_t step, client::PushStats& push,
                                     client::PullStats& pull) {
  params_ready_ = false;
  // The shards measure the gradients' staleness from the parameters they
  // were computed on, not from the exchange about to land.
  std::vector<int64_t> computed_at = params_versions_;
  // The exchange before sends grad_spans_: it lands before they are
  // overwritten.
  RETURN_IF_ERROR(LandExchange(&push, &pull));
  RETURN_IF_ERROR(CopyGradsToHost());
  exchange_->Start(step + 1, std::move(computed_at), grad_spans_, next_param_spans_);
  // The next step computes on what the landed exchange fetched (or, after
  // the first step, on this step's parameters again).
  params_ready_ = true;
  return absl::OkStatus();
}

bool Trainer::exchange_in_flight() const {
  return exchange_ != nullptr && exchange_->in_flight();
}

absl::Status Trainer::LandExchange(client::PushStats* push, client::PullStats* pull) {
  if (!exchange_in_flight()) return absl::OkStatus();
  RETURN_IF_ERROR(exchange_->Land(push, pull));
  // The buffers trade places; params_'s page-locks stay with theirs.
  params_.swap(next_params_);
  param_spans_.swap(next_param_spans_);
  params_versions_ = client_->PulledVersions();
  return absl::OkStatus();
}

void Trainer::RecordStep(const StepTimes& times, const client::PushStats& push,
                         const client::PullStats& pull, int batch, float loss) {
  // With overlap the push of this step and the pull of the next run behind
  // compute; what is left shows up as the next step's pull and wait.
  const double pull_total = absl::ToDoubleSeconds(times.pulled - times.start);
  const double wait = std::min(pull.server_wait_seconds, pull_total);
  const double compute = absl::ToDoubleSeconds(times.computed - times.pulled);
  const double push_seconds = absl::ToDoubleSeconds(times.pushed - times.computed);
  const double step_seconds = absl::ToDoubleSeconds(times.pushed - times.start);
  wait_seconds_ += wait;
  pull_seconds_ += pull_total - wait;
  compute_seconds_ += compute;
  push_seconds_ += push_seconds;
  staleness_sum_ += static_cast<double>(push.max_staleness);
  max_staleness_ = std::max(max_staleness_, push.max_staleness);
  const double rate = batch / std::max(step_seconds, 1e-9);
  smoothed_rate_ = smoothed_rate_ == 0 ? rate : 0.95 * smoothed_rate_ + 0.05 * rate;
  if (metrics_ == nullptr) return;
  metrics_->wait_seconds().Observe(wait);
  metrics_->pull_seconds().Observe(pull_total - wait);
  metrics_->compute_seconds().Observe(compute);
  metrics_->push_seconds().Observe(push_seconds);
  metrics_->step_seconds().Observe(step_seconds);
  metrics_->staleness().Observe(static_cast<double>(push.max_staleness));
  metrics_->steps().Increment();
  metrics_->samples().Increment(batch);
  metrics_->samples_per_second().Set(smoothed_rate_);
  metrics_->loss().Set(loss);
}

EpochResult Trainer::PhaseTotals() const {
  EpochResult totals;
  totals.compute_seconds = compute_seconds_;
  totals.push_seconds = push_seconds_;
  totals.pull_seconds = pull_seconds_;
  totals.wait_seconds = wait_seconds_;
  return totals;
}

absl::StatusOr<double> Trainer::Evaluate(const Dataset& test) {
  if (eval_model_ == nullptr) {
    return absl::FailedPreconditionError("only the chief worker evaluates");
  }
  if (test.num_examples == 0) {
    return absl::InvalidArgumentError("the test set is empty");
  }
  RETURN_IF_ERROR(PullParameters(0));
  for (size_t i = 0; i < params_.size(); ++i) {
    RETURN_IF_ERROR(eval_model_->SetParam(static_cast<int>(i), params_[i]));
  }
  int64_t correct = 0;
  for (int begin = 0; begin < test.num_examples; begin += options_.eval_batch) {
    const int n = std::min(options_.eval_batch, test.num_examples - begin);
    ASSIGN_OR_RETURN(int batch_correct,
                     eval_model_->CountCorrect(
                         test.features.data() +
                             static_cast<size_t>(begin) * test.feature_dim,
                         test.labels.data() + begin, n));
    correct += batch_correct;
  }
  const double accuracy = static_cast<double>(correct) / test.num_examples;
  if (metrics_ != nullptr) metrics_->test_accuracy().Set(accuracy);
  return accuracy;
}

void Trainer::StartHeartbeats() {
  heartbeats_ = std::make_unique<HeartbeatThread>(client_, &clock_,
                                                  options_.heartbeat_interval);
}

void Trainer::StopHeartbeats() { heartbeats_.reset(); }

absl::StatusOr<int64_t> Trainer::ClusterSteps() {
  ASSIGN_OR_RETURN(HeartbeatResponse response,
                   client_->Heartbeat(clock_.load(), /*done=*/false,
                                      absl::InfiniteDuration()));
  int64_t steps = 0;
  for (const WorkerState& worker : response.workers()) steps += worker.clock();
  return steps;
}

absl::Status Trainer::WaitForOtherWorkers() {
  const absl::Time give_up = absl::Now() + options_.wait_for_workers;
  while (true) {
    ASSIGN_OR_RETURN(HeartbeatResponse response,
                     client_->Heartbeat(clock_.load(), /*done=*/true, absl::InfiniteDuration()));
    int finished = 0;
    for (const WorkerState& worker : response.workers()) {
      if (worker.done() || !worker.live()) ++finished;
    }
    if (finished >= options_.num_workers) return absl::OkStatus();
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%d of %d workers finished within %s", finished, options_.num_workers,
          absl::FormatDuration(options_.wait_for_workers)));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

// Where Run is in the current epoch.
struct Trainer::EpochTally {
  int epoch = 0;  // the epoch the data shard is in (0: none yet)
  int64_t data_clock = -1;  // the clock the shard's next batch belongs to
  absl::Time start;
  double loss_sum = 0;
  int steps = 0;
};

absl::StatusOr<TrainResult> Trainer::Run(
    const Dataset& train, const Dataset* test,
    const std::function<void(const EpochResult&)>& on_epoch) {
  if (options_.chief && test == nullptr) {
    return absl::InvalidArgumentError("the chief needs a test set");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DataShard> shard,
                   DataShard::Create(train.num_examples, options_.worker_index,
                                     options_.num_workers, options_.seed));
  const int steps_per_epoch = shard->StepsPerEpoch(options_.batch);
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d training examples over %d workers give no full batch of %d",
        train.num_examples, options_.num_workers, options_.batch));
  }
  std::vector<float> x(static_cast<size_t>(options_.batch) * train.feature_dim);
  std::vector<int32_t> labels(options_.batch);
  const int64_t total_steps = int64_t{options_.epochs} * steps_per_epoch;
  const int64_t first_step = clock_.load();
  if (first_step > 0) {
    LOG(INFO) << "resuming at step " << first_step << " (epoch "
              << first_step / steps_per_epoch + 1 << ", batch "
              << first_step % steps_per_epoch << ") of " << total_steps;
  }

  RunTotals totals;
  StartHeartbeats();
  totals.start = absl::Now();
  if (options_.chief && first_step > 0) {
    ASSIGN_OR_RETURN(totals.cluster_steps_at_start, ClusterSteps());
  }
  totals.cluster_steps_before = totals.cluster_steps_at_start;
  EpochTally tally;
  while (clock_.load() < total_steps) {
    const int64_t step = clock_.load();
    const int epoch = static_cast<int>(step / steps_per_epoch) + 1;
    if (epoch != tally.epoch) BeginEpoch(epoch, step, *shard, tally);
    if (tally.data_clock != step) {
      RETURN_IF_ERROR(shard->Seek(static_cast<int>(step % steps_per_epoch), options_.batch));
    }
    RETURN_IF_ERROR(shard->NextBatch(train, options_.batch, x.data(), labels.data()));
    tally.data_clock = step + 1;
    ASSIGN_OR_RETURN(float loss, Step(x.data(), labels.data(), options_.batch));
    ++totals.steps_run;
    if (totals.steps_run == 1) {
      LOG(INFO) << "first training step done (step " << step << ", "
                << absl::FormatDuration(absl::Trunc(absl::Now() - totals.start,
                                                    absl::Milliseconds(1)))
                << " after training began)";
    }
    tally.loss_sum += loss;
    ++tally.steps;
    const int64_t now_at = clock_.load();
    if (now_at % steps_per_epoch != 0 || now_at / steps_per_epoch != epoch) continue;

    // This step ended the epoch.
    ASSIGN_OR_RETURN(EpochResult epoch_result, EndEpoch(tally, test, totals));
    totals.result.epochs.push_back(epoch_result);
    if (on_epoch) on_epoch(epoch_result);
    tally.epoch = 0;  // the next step begins the next epoch
  }
  RETURN_IF_ERROR(FinishRun(test, totals));
  return std::move(totals.result);
}

void Trainer::BeginEpoch(int epoch, int64_t step, DataShard& shard, EpochTally& tally) {
  if (tally.epoch != 0) {
    LOG(WARNING) << "epoch " << tally.epoch << " ends unreported: worker "
                 << options_.worker_index << " rejoined at step " << step;
  }
  if (metrics_ != nullptr) metrics_->epoch().Set(epoch);
  shard.BeginEpoch(epoch);
  tally = EpochTally();
  tally.epoch = epoch;
  tally.start = absl::Now();
  compute_seconds_ = push_seconds_ = pull_seconds_ = wait_seconds_ = 0;
  staleness_sum_ = 0;
  max_staleness_ = 0;
}

absl::StatusOr<EpochResult> Trainer::EndEpoch(const EpochTally& tally, const Dataset* test,
                                              RunTotals& totals) {
  // The chief asks the shards for the job's steps: no exchange may be in
  // flight on the client meanwhile.
  if (options_.stale_overlap && options_.chief) RETURN_IF_ERROR(Drain());
  EpochResult epoch_result;
  epoch_result.epoch = tally.epoch;
  epoch_result.train_loss = tally.loss_sum / tally.steps;
  if (metrics_ != nullptr) metrics_->epoch_loss().Set(epoch_result.train_loss);
  epoch_result.seconds = absl::ToDoubleSeconds(absl::Now() - tally.start);
  epoch_result.mean_staleness = staleness_sum_ / tally.steps;
  epoch_result.max_staleness = max_staleness_;
  epoch_result.compute_seconds = compute_seconds_;
  epoch_result.push_seconds = push_seconds_;
  epoch_result.pull_seconds = pull_seconds_;
  epoch_result.wait_seconds = wait_seconds_;
  double samples = static_cast<double>(tally.steps) * options_.batch;
  if (options_.chief) {
    // Throughput of the whole job, from the clocks the shards have seen.
    ASSIGN_OR_RETURN(int64_t cluster_steps, ClusterSteps());
    samples = static_cast<double>(cluster_steps - totals.cluster_steps_before) * options_.batch;
    totals.cluster_steps_before = cluster_steps;
    if (tally.epoch == options_.epochs) {
      // The last evaluation waits for everyone, so it sees the final model.
      StopHeartbeats();
      RETURN_IF_ERROR(WaitForOtherWorkers());
      totals.final_evaluated = true;
    }
    ASSIGN_OR_RETURN(epoch_result.test_accuracy, Evaluate(*test));
  }
  epoch_result.samples_per_second = samples / std::max(epoch_result.seconds, 1e-9);
  return epoch_result;
}

absl::Status Trainer::FinishRun(const Dataset* test, RunTotals& totals) {
  TrainResult& result = totals.result;
  StopHeartbeats();
  RETURN_IF_ERROR(Drain());
  if (!options_.chief) {
    ASSIGN_OR_RETURN(HeartbeatResponse ignored,
                     client_->Heartbeat(clock_.load(), /*done=*/true, absl::InfiniteDuration()));
  } else if (!totals.final_evaluated) {
    // Resumed at (or rejoined at) the end, or no epochs: the chief still
    // waits for the others and reports the final model.
    RETURN_IF_ERROR(WaitForOtherWorkers());
    ASSIGN_OR_RETURN(result.final_test_accuracy, Evaluate(*test));
  }
  result.wall_seconds = absl::ToDoubleSeconds(absl::Now() - totals.start);
  result.steps = totals.steps_run;
  if (!result.epochs.empty() && totals.final_evaluated) {
    result.final_test_accuracy = result.epochs.back().test_accuracy;
  }
  const double wall = std::max(result.wall_seconds, 1e-9);
  if (options_.chief) {
    ASSIGN_OR_RETURN(int64_t cluster_steps, ClusterSteps());
    result.samples_per_second =
        static_cast<double>(cluster_steps - totals.cluster_steps_at_start) * options_.batch / wall;
  } else {
    result.samples_per_second = static_cast<double>(totals.steps_run) * options_.batch / wall;
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::worker
