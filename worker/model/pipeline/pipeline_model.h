// PipelineModel: an Mlp split into pipeline stages, trained on microbatches.
//
// The model "mlp:d0-d1-...-dL" has L Linear layers (each but the last
// followed by a ReLU). PipelineModel cuts them into S contiguous stages of
// Linear(+ReLU) blocks, as even in count as possible, each built by
// BuildMlpSection (mlp_layout.h) as Mlp builds its whole model; stage s owns
// its layers, its parameters and its own Backend (one CPU backend per stage,
// or one GPU per stage). ForwardBackward splits a batch into M microbatches, runs a
// GPipe or 1F1B schedule (schedule.h) over them with activations and their
// gradients crossing stages through a StageTransport, and accumulates each
// parameter's gradient over the microbatches so the result is the gradient
// of the mean loss over the whole batch -- the same as Mlp gives for the
// whole batch, up to float rounding.
//
// The public API mirrors worker::Mlp (params(), SetParam, GetParam,
// ForwardBackward, GetGrad, CountCorrect) with the same parameter names and
// order, so a trainer can use either. stage_of_param(i) says which stage
// holds parameter i, so each stage can push/pull its own layers' partitions.
//
// Example:
//   PipelineOptions options;
//   options.stages = 2;
//   options.microbatches = 4;
//   ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model,
//                    PipelineModel::CreateCpu(spec, /*max_batch=*/64,
//                                             options));
//   ASSIGN_OR_RETURN(float loss, model->ForwardBackward(x, labels, 64,
//       [&](int i) { PushGradient(i); }));
#ifndef SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_MODEL_H_
#define SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/device/backend.h"
#include "worker/model/grad_staging.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"
#include "worker/model/pipeline/schedule.h"
#include "worker/model/pipeline/transport.h"

namespace shardtrain::worker::pipeline {

struct PipelineOptions {
  // Number of stages S; 1 <= S <= number of Linear layers.
  int stages = 2;
  // Microbatches M per ForwardBackward; every batch must have >= M examples.
  // A batch not divisible by M is split into M near-equal parts.
  int microbatches = 4;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // Run each stage on its own thread when the transport allows it (CPU
  // stages then overlap). Otherwise one thread drives all stages in turn,
  // which is what asynchronous GPU backends want anyway.
  bool concurrent_stages = true;
};

// Makes the transport once the stage backends exist (stage_backends[s] is
// stage s's, owned by the PipelineModel).
using TransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<StageTransport>>(
        std::vector<Backend*> stage_backends)>;

// Thread-compatible, like Mlp: one caller at a time. Internally it may run
// one thread per stage during ForwardBackward.
class PipelineModel : public Model {
 public:
  // stage_backends: one per stage (options.stages of them), owned from now on.
  // make_transport: nullptr means a LocalTransport. INVALID_ARGUMENT for an
  // invalid spec, wrong backend count, null backend, stages outside
  // [1, number of Linear layers], microbatches < 1 or max_batch <
  // microbatches.
  static absl::StatusOr<std::unique_ptr<PipelineModel>> Create(
      const ModelSpec& spec, std::vector<std::unique_ptr<Backend>> backends,
      int max_batch, const PipelineOptions& options,
      const TransportFactory& make_transport = nullptr);
  // One CPU backend per stage, LocalTransport.
  static absl::StatusOr<std::unique_ptr<PipelineModel>> CreateCpu(
      const ModelSpec& spec, int max_batch, const PipelineOptions& options);

  ~PipelineModel() override;
  PipelineModel(const PipelineModel&) = delete;
  PipelineModel& operator=(const PipelineModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const PipelineOptions& options() const { return options_; }
  int max_batch() const { return max_batch_; }
  int input_dim() const { return spec_.layer_sizes.front(); }
  int num_classes() const { return spec_.layer_sizes.back(); }
  int num_stages() const { return static_cast<int>(stages_.size()); }

  // Same names, shapes, init and order as Mlp::params().
  const std::vector<ParamInfo>& params() const override { return params_; }
  // The stage that holds parameter i. REQUIRES: 0 <= i < params().size().
  int stage_of_param(int index) const { return param_stage_[index]; }
  // Stage s's backend. REQUIRES: 0 <= s < num_stages().
  Backend* stage_backend(int s) const;
  // The stage's schedule, as MakeSchedule gives it.
  const Schedule& schedule() const { return schedule_; }

  // As Mlp::SetParam / GetParam.
  absl::Status SetParam(int index, absl::Span<const float> host_values) override;
  // As Mlp::PinParamHost, on the backend of the stage that holds the parameter.
  absl::StatusOr<std::unique_ptr<HostPin>> PinParamHost(int index,
                                                        absl::Span<float> host) override;
  absl::Status GetParam(int index, absl::Span<float> host_out) const override;

  // As Mlp::ForwardBackward, plus INVALID_ARGUMENT for batch <
  // microbatches. Returns the mean loss over the batch; GetGrad then gives
  // the gradient of that mean. on_grad_ready(i) fires once per parameter as
  // soon as its gradient is final, i.e. after its stage's last backward
  // microbatch; with concurrent stages it runs on that stage's thread, but
  // never two calls at once. Inside it GetGrad(i) and StartGradCopy(i) are
  // allowed, nothing else.
  absl::StatusOr<float> ForwardBackward(
      const float* x, const int32_t* labels, int batch,
      const std::function<void(int)>& on_grad_ready = nullptr) override;

  // As Mlp::GetGrad.
  absl::Status GetGrad(int index, absl::Span<float> host_out) const override;
  // As Mlp::StartGradCopy, from the stage that holds the parameter.
  absl::StatusOr<PendingGrad> StartGradCopy(int index) override;

  // As Mlp::CountCorrect: forward only, any batch >= 1, chunked.
  absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels,
                                   int batch) override;

 private:
  struct Stage;
  struct StepState;

  PipelineModel(const ModelSpec& spec, int max_batch,
                const PipelineOptions& options);

  // The steps of Create: check its arguments, make and check the schedule,
  // build each stage (its layers, then its buffers), connect the stages.
  static absl::Status CheckCreateArgs(
      const ModelSpec& spec,
      const std::vector<std::unique_ptr<Backend>>& backends, int max_batch,
      const PipelineOptions& options);
  absl::Status BuildSchedule();
  absl::Status BuildStages(std::vector<std::unique_ptr<Backend>> backends);
  // Builds Linear layers [first_linear, end_linear) on stage s's backend
  // and appends their parameters to params_.
  absl::Status AddLayers(int s, int first_linear, int end_linear,
                         Stage& stage);
  // Gradient sums, `live_slots` activation slots (with labels on the last
  // stage) and the ping-pong gradient buffers.
  absl::Status AllocateStageBuffers(int live_slots, bool last_stage,
                                    Stage& stage);
  absl::Status ConnectStages(const TransportFactory& make_transport);
  // Runs one op of the schedule on stage s.
  absl::Status RunOp(int s, const Op& op, StepState& step);
  absl::Status RunForward(int s, int mb, StepState& step);
  absl::Status RunBackward(int s, int mb, StepState& step);
  // Runs every stage's schedule, concurrently or interleaved on this thread.
  absl::Status RunSchedule(StepState& step);
  absl::Status RunStage(int s, StepState& step);

  const ModelSpec spec_;
  const int max_batch_;
  const PipelineOptions options_;
  // Rows of the largest microbatch: ceil(max_batch / microbatches).
  const int max_microbatch_;
  Schedule schedule_;

  std::vector<std::unique_ptr<Stage>> stages_;
  std::unique_ptr<StageTransport> transport_;
  std::vector<ParamInfo> params_;
  std::vector<int> param_stage_;  // Parallel to params_.

  GradStaging staging_{0};  // One slot per parameter.

  // Serialises on_grad_ready calls coming from different stage threads.
  absl::Mutex callback_mu_;
};

}  // namespace shardtrain::worker::pipeline

#endif  // SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_MODEL_H_
