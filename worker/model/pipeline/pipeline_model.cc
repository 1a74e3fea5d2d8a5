#include "worker/model/pipeline/pipeline_model.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/layers.h"
#include "worker/model/mlp_layout.h"

namespace shardtrain::worker::pipeline {
namespace {

constexpr absl::string_view kName = "PipelineModel";

}  // namespace

// One stage: a contiguous run of Linear(+ReLU) blocks on its own backend.
// Used by one thread at a time (the stage's thread during a step, the
// caller's otherwise).
struct PipelineModel::Stage {
  std::unique_ptr<Backend> backend;
  // Linear, ReLU, Linear, ..., each Linear followed by a ReLU unless it is
  // the model's last layer.
  std::vector<std::unique_ptr<Layer>> layers;
  int first_param = 0;  // Global index of this stage's first parameter.
  // Per local parameter (numbered like the global list, from first_param):
  // the layer and the layer-local index that hold it.
  std::vector<ParamSlot> param_slots;
  // Per local parameter: the gradient summed over the step's microbatches.
  std::vector<std::unique_ptr<DeviceBuffer>> grad_sums;
  int widest = 0;                     // Widest activation of the stage.

  // Activation slots, each holding one microbatch's activations:
  // activations[k][l] is the input of layers[l] (l == layers.size(): the
  // stage output), max_microbatch rows. There are as many slots as the
  // schedule keeps microbatches alive on this stage.
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> activations;
  std::vector<std::unique_ptr<DeviceLabelBuffer>> labels;  // Last stage.
  std::vector<int> free_slots;
  std::vector<int> slot_of_microbatch;  // -1 when not alive.
  // Ping-pong buffers for dL/d(activation), max_microbatch * widest floats.
  std::unique_ptr<DeviceBuffer> grad_a;
  std::unique_ptr<DeviceBuffer> grad_b;
  // After Backward(mb): which buffer holds dL/d(stage input) of mb.
  const float* input_grad = nullptr;
  int input_grad_microbatch = -1;

  int backwards_done = 0;
  double weighted_loss = 0;  // Last stage: sum over mb of loss * rows/batch.

  int in_dim() const { return layers.front()->in_dim(); }
  int out_dim() const { return layers.back()->out_dim(); }
};

// The batch being processed by ForwardBackward.
struct PipelineModel::StepState {
  const float* x = nullptr;
  const int32_t* labels = nullptr;
  int batch = 0;
  std::vector<int> offset;  // First row of each microbatch.
  std::vector<int> rows;    // Rows of each microbatch.
  const std::function<void(int)>* on_grad_ready = nullptr;
};

PipelineModel::PipelineModel(const ModelSpec& spec, int max_batch,
                             const PipelineOptions& options)
    : spec_(spec),
      max_batch_(max_batch),
      options_(options),
      max_microbatch_((max_batch + options.microbatches - 1) /
                      options.microbatches) {}

PipelineModel::~PipelineModel() = default;

absl::StatusOr<std::unique_ptr<PipelineModel>> PipelineModel::CreateCpu(
    const ModelSpec& spec, int max_batch, const PipelineOptions& options) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (int s = 0; s < std::max(options.stages, 0); ++s) {
    backends.push_back(MakeCpuBackend());
  }
  return Create(spec, std::move(backends), max_batch, options);
}

absl::StatusOr<std::unique_ptr<PipelineModel>> PipelineModel::Create(
    const ModelSpec& spec, std::vector<std::unique_ptr<Backend>> backends,
    int max_batch, const PipelineOptions& options,
    const TransportFactory& make_transport) {
  RETURN_IF_ERROR(CheckCreateArgs(spec, backends, max_batch, options));
  std::unique_ptr<PipelineModel> model(
      new PipelineModel(spec, max_batch, options));
  RETURN_IF_ERROR(model->BuildSchedule());
  RETURN_IF_ERROR(model->BuildStages(std::move(backends)));
  RETURN_IF_ERROR(model->ConnectStages(make_transport));
  model->staging_ = GradStaging(model->params_.size());
  return model;
}

absl::Status PipelineModel::CheckCreateArgs(
    const ModelSpec& spec, const std::vector<std::unique_ptr<Backend>>& backends,
    int max_batch, const PipelineOptions& options) {
  RETURN_IF_ERROR(spec.Validate());
  const int num_linear = NumLinearLayers(spec);
  if (options.stages < 1 || options.stages > num_linear) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineModel: stages must be in [1, ", num_linear,
        "] (the model's Linear layers), got ", options.stages));
  }
  if (options.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineModel: microbatches must be >= 1, got ",
                     options.microbatches));
  }
  if (max_batch < options.microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineModel: max_batch ", max_batch, " is below the ",
        options.microbatches, " microbatches"));
  }
  if (static_cast<int>(backends.size()) != options.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineModel: ", backends.size(), " backends for ",
                     options.stages, " stages"));
  }
  for (size_t s = 0; s < backends.size(); ++s) {
    if (backends[s] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("PipelineModel: backend of stage ", s, " is null"));
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::BuildSchedule() {
  schedule_ = MakeSchedule(options_.schedule, options_.stages,
                           options_.microbatches);
  return ValidateSchedule(schedule_, options_.microbatches);
}

absl::Status PipelineModel::BuildStages(
    std::vector<std::unique_ptr<Backend>> backends) {
  const std::vector<int> live = PeakLiveActivations(schedule_);
  const int num_linear = NumLinearLayers(spec_);
  const int stages = options_.stages;
  // Stage s gets num_linear / S Linear layers, the first num_linear % S
  // stages one more.
  int next_linear = 0;
  for (int s = 0; s < stages; ++s) {
    const int count = num_linear / stages + (s < num_linear % stages ? 1 : 0);
    auto stage = std::make_unique<Stage>();
    stage->backend = std::move(backends[s]);
    RETURN_IF_ERROR(AddLayers(s, next_linear, next_linear + count, *stage));
    RETURN_IF_ERROR(AllocateStageBuffers(live[s], s + 1 == stages, *stage));
    stages_.push_back(std::move(stage));
    next_linear += count;
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::AddLayers(int s, int first_linear, int end_linear,
                                      Stage& stage) {
  ASSIGN_OR_RETURN(MlpSection section,
                   BuildMlpSection(spec_, first_linear, end_linear,
                                   stage.backend.get()));
  stage.first_param = static_cast<int>(params_.size());
  stage.layers = std::move(section.layers);
  stage.param_slots = std::move(section.slots);
  for (ParamInfo& param : section.params) {
    params_.push_back(std::move(param));
    param_stage_.push_back(s);
  }
  stage.widest = stage.in_dim();
  for (const auto& layer : stage.layers) {
    stage.widest = std::max(stage.widest, layer->out_dim());
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::AllocateStageBuffers(int live_slots,
                                                 bool last_stage,
                                                 Stage& stage) {
  Backend& backend = *stage.backend;
  const size_t rows = max_microbatch_;
  for (const ParamSlot& slot : stage.param_slots) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<DeviceBuffer> sum,
        backend.Allocate(stage.layers[slot.layer]->grad(slot.local)->size()));
    stage.grad_sums.push_back(std::move(sum));
  }
  for (int k = 0; k < live_slots; ++k) {
    std::vector<std::unique_ptr<DeviceBuffer>> slot;
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> input,
                     backend.Allocate(rows * stage.in_dim()));
    slot.push_back(std::move(input));
    for (const auto& layer : stage.layers) {
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> out,
                       backend.Allocate(rows * layer->out_dim()));
      slot.push_back(std::move(out));
    }
    stage.activations.push_back(std::move(slot));
    if (last_stage) {
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceLabelBuffer> labels,
                       backend.AllocateLabels(rows));
      stage.labels.push_back(std::move(labels));
    }
  }
  ASSIGN_OR_RETURN(stage.grad_a, backend.Allocate(rows * stage.widest));
  ASSIGN_OR_RETURN(stage.grad_b, backend.Allocate(rows * stage.widest));
  return absl::OkStatus();
}

absl::Status PipelineModel::ConnectStages(
    const TransportFactory& make_transport) {
  std::vector<Backend*> stage_backends;
  for (const auto& stage : stages_) {
    stage_backends.push_back(stage->backend.get());
  }
  if (make_transport) {
    ASSIGN_OR_RETURN(transport_, make_transport(stage_backends));
  } else {
    ASSIGN_OR_RETURN(transport_, LocalTransport::Create(stage_backends));
  }
  if (transport_ == nullptr || transport_->num_stages() != options_.stages) {
    return absl::InvalidArgumentError(
        "PipelineModel: the transport factory gave no transport, or one for "
        "a different number of stages");
  }
  return absl::OkStatus();
}

Backend* PipelineModel::stage_backend(int s) const {
  return stages_[s]->backend.get();
}

absl::Status PipelineModel::SetParam(int index,
                                     absl::Span<const float> host_values) {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_values.size()));
  Stage& stage = *stages_[param_stage_[index]];
  const ParamSlot slot = stage.param_slots[index - stage.first_param];
  return stage.backend->CopyFromHost(
      host_values, stage.layers[slot.layer]->param(slot.local), 0);
}

absl::StatusOr<std::unique_ptr<HostPin>> PipelineModel::PinParamHost(
    int index, absl::Span<float> host) {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host.size()));
  return stages_[param_stage_[index]]->backend->PinHost(host);
}

absl::Status PipelineModel::GetParam(int index,
                                     absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_out.size()));
  const Stage& stage = *stages_[param_stage_[index]];
  const ParamSlot slot = stage.param_slots[index - stage.first_param];
  return stage.backend->CopyToHost(
      *stage.layers[slot.layer]->param(slot.local), 0, host_out);
}

absl::Status PipelineModel::GetGrad(int index,
                                    absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_out.size()));
  const Stage& stage = *stages_[param_stage_[index]];
  return stage.backend->CopyToHost(
      *stage.grad_sums[index - stage.first_param], 0, host_out);
}

absl::StatusOr<PendingGrad> PipelineModel::StartGradCopy(int index) {
  const bool valid = index >= 0 && index < static_cast<int>(params_.size());
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index,
                                   valid ? NumElements(params_[index]) : 0));
  Stage& stage = *stages_[param_stage_[index]];
  return staging_.Start(index, *stage.backend,
                        *stage.grad_sums[index - stage.first_param]);
}

absl::StatusOr<float> PipelineModel::ForwardBackward(
    const float* x, const int32_t* labels, int batch,
    const std::function<void(int)>& on_grad_ready) {
  RETURN_IF_ERROR(
      CheckBatch(kName, x, labels, batch, max_batch_, num_classes()));
  const int m = options_.microbatches;
  if (batch < m) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineModel: batch ", batch, " is smaller than the ",
                     m, " microbatches"));
  }
  StepState step;
  step.x = x;
  step.labels = labels;
  step.batch = batch;
  step.on_grad_ready = on_grad_ready ? &on_grad_ready : nullptr;
  // The first batch % m microbatches take one extra row.
  for (int mb = 0, start = 0; mb < m; ++mb) {
    const int rows = batch / m + (mb < batch % m ? 1 : 0);
    step.offset.push_back(start);
    step.rows.push_back(rows);
    start += rows;
  }
  for (auto& stage : stages_) {
    stage->free_slots.clear();
    for (int k = static_cast<int>(stage->activations.size()) - 1; k >= 0;
         --k) {
      stage->free_slots.push_back(k);
    }
    stage->slot_of_microbatch.assign(m, -1);
    stage->input_grad = nullptr;
    stage->input_grad_microbatch = -1;
    stage->backwards_done = 0;
    stage->weighted_loss = 0;
  }
  transport_->Reset();
  RETURN_IF_ERROR(RunSchedule(step));
  // Asynchronous (GPU) stages have only queued their last backward steps.
  for (auto& stage : stages_) RETURN_IF_ERROR(stage->backend->Synchronize());
  return static_cast<float>(stages_.back()->weighted_loss);
}

absl::Status PipelineModel::RunSchedule(StepState& step) {
  const int num = num_stages();
  if (options_.concurrent_stages && num > 1 &&
      transport_->SupportsConcurrentStages()) {
    // Threads inherit this thread's floating-point environment (POSIX), so
    // flush-to-zero settings carry over.
    std::vector<absl::Status> results(num);
    std::vector<std::thread> threads;
    for (int s = 1; s < num; ++s) {
      threads.emplace_back([this, s, &step, &results] {
        results[s] = RunStage(s, step);
      });
    }
    results[0] = RunStage(0, step);
    for (std::thread& t : threads) t.join();
    // Report the failure that caused the others, not their cancellation.
    for (const absl::Status& status : results) {
      if (!status.ok() && !absl::IsCancelled(status)) return status;
    }
    for (const absl::Status& status : results) RETURN_IF_ERROR(status);
    return absl::OkStatus();
  }

  // One thread: advance each stage until it needs a message that has not
  // been sent yet. Sends are buffered, so a valid schedule always lets some
  // stage move.
  std::vector<size_t> next(num, 0);
  size_t remaining = 0;
  for (const auto& ops : schedule_) remaining += ops.size();
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < num; ++s) {
      while (next[s] < schedule_[s].size()) {
        const Op& op = schedule_[s][next[s]];
        if (op.type == OpType::kRecvActivation &&
            !transport_->Arrived({s - 1, s, Payload::kActivation,
                                  op.microbatch})) {
          break;
        }
        if (op.type == OpType::kRecvGrad &&
            !transport_->Arrived({s + 1, s, Payload::kActivationGrad,
                                  op.microbatch})) {
          break;
        }
        RETURN_IF_ERROR(RunOp(s, op, step));
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      return absl::InternalError("PipelineModel: the schedule deadlocked");
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::RunStage(int s, StepState& step) {
  for (const Op& op : schedule_[s]) {
    absl::Status status = RunOp(s, op, step);
    if (!status.ok()) {
      transport_->Cancel();
      return absl::Status(status.code(),
                          absl::StrCat("stage ", s, " ", OpName(op), ": ",
                                       status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::RunOp(int s, const Op& op, StepState& step) {
  Stage& stage = *stages_[s];
  const int mb = op.microbatch;
  const size_t rows = step.rows[mb];
  switch (op.type) {
    case OpType::kForward:
      return RunForward(s, mb, step);
    case OpType::kBackward:
      return RunBackward(s, mb, step);
    case OpType::kRecvActivation: {
      if (stage.free_slots.empty()) {
        return absl::InternalError("PipelineModel: no free activation slot");
      }
      const int slot = stage.free_slots.back();
      stage.free_slots.pop_back();
      stage.slot_of_microbatch[mb] = slot;
      return transport_->Recv({s - 1, s, Payload::kActivation, mb},
                              stage.activations[slot][0]->data(),
                              rows * stage.in_dim());
    }
    case OpType::kSendActivation: {
      const int slot = stage.slot_of_microbatch[mb];
      if (slot < 0) {
        return absl::InternalError("PipelineModel: send before forward");
      }
      return transport_->Send({s, s + 1, Payload::kActivation, mb},
                              stage.activations[slot].back()->data(),
                              rows * stage.out_dim());
    }
    case OpType::kRecvGrad:
      return transport_->Recv({s + 1, s, Payload::kActivationGrad, mb},
                              stage.grad_a->data(), rows * stage.out_dim());
    case OpType::kSendGrad:
      if (stage.input_grad_microbatch != mb) {
        return absl::InternalError(
            "PipelineModel: gradient send not right after its backward");
      }
      return transport_->Send({s, s - 1, Payload::kActivationGrad, mb},
                              stage.input_grad, rows * stage.in_dim());
  }
  return absl::InternalError("PipelineModel: unknown op");
}

absl::Status PipelineModel::RunForward(int s, int mb, StepState& step) {
  Stage& stage = *stages_[s];
  Backend& backend = *stage.backend;
  const int rows = step.rows[mb];
  if (s == 0) {
    if (stage.free_slots.empty()) {
      return absl::InternalError("PipelineModel: no free activation slot");
    }
    stage.slot_of_microbatch[mb] = stage.free_slots.back();
    stage.free_slots.pop_back();
  }
  const int slot = stage.slot_of_microbatch[mb];
  if (slot < 0) {
    return absl::InternalError("PipelineModel: forward before receive");
  }
  auto& acts = stage.activations[slot];
  if (s == 0) {
    RETURN_IF_ERROR(backend.CopyFromHost(
        absl::MakeConstSpan(step.x + int64_t{step.offset[mb]} * input_dim(),
                            size_t(rows) * input_dim()),
        acts[0].get(), 0));
  }
  if (s + 1 == num_stages()) {
    RETURN_IF_ERROR(backend.CopyLabelsFromHost(
        absl::MakeConstSpan(step.labels + step.offset[mb], rows),
        stage.labels[slot].get(), 0));
  }
  for (size_t l = 0; l < stage.layers.size(); ++l) {
    RETURN_IF_ERROR(
        stage.layers[l]->Forward(rows, acts[l]->data(), acts[l + 1]->data()));
  }
  return absl::OkStatus();
}

absl::Status PipelineModel::RunBackward(int s, int mb, StepState& step) {
  Stage& stage = *stages_[s];
  Backend& backend = *stage.backend;
  const int rows = step.rows[mb];
  const int slot = stage.slot_of_microbatch[mb];
  if (slot < 0) {
    return absl::InternalError("PipelineModel: backward before forward");
  }
  auto& acts = stage.activations[slot];
  float* dy = stage.grad_a->data();
  float* dx = stage.grad_b->data();
  if (s + 1 == num_stages()) {
    ASSIGN_OR_RETURN(float loss, backend.SoftmaxCrossEntropy(
                                     rows, num_classes(), acts.back()->data(),
                                     stage.labels[slot]->data(), dy));
    stage.weighted_loss += double(loss) * rows / step.batch;
  }

  // dy is the gradient of this microbatch's mean loss; the batch mean weighs
  // the microbatch by rows / batch. The first microbatch overwrites the sums
  // (beta = 0), later ones add to them.
  const float weight = float(rows) / float(step.batch);
  const float beta = stage.backwards_done == 0 ? 0.0f : 1.0f;
  const bool final_microbatch =
      stage.backwards_done + 1 == options_.microbatches;
  absl::Status accumulate_status;
  int next_local = static_cast<int>(stage.param_slots.size());
  for (int l = static_cast<int>(stage.layers.size()) - 1; l >= 0; --l) {
    Layer& layer = *stage.layers[l];
    const int first_local = next_local - layer.num_params();
    // sum = weight * grad + beta * sum on the device, in fp32 whatever the
    // GEMM precision.
    auto accumulate = [&](int j) {
      if (!accumulate_status.ok()) return;
      const int local = first_local + j;
      accumulate_status = backend.Axpby(
          static_cast<int64_t>(layer.grad(j)->size()), weight,
          layer.grad(j)->data(), beta, stage.grad_sums[local]->data());
      if (accumulate_status.ok() && final_microbatch &&
          step.on_grad_ready != nullptr) {
        absl::MutexLock lock(&callback_mu_);
        (*step.on_grad_ready)(stage.first_param + local);
      }
    };
    std::function<void(int)> on_param_grad;
    if (layer.num_params() > 0) on_param_grad = accumulate;
    // The model's input gradient is never used.
    float* layer_dx = (l == 0 && s == 0) ? nullptr : dx;
    RETURN_IF_ERROR(layer.Backward(rows, acts[l]->data(), acts[l + 1]->data(),
                                   dy, layer_dx, on_param_grad));
    RETURN_IF_ERROR(accumulate_status);
    next_local = first_local;
    std::swap(dy, dx);
  }
  stage.input_grad = dy;
  stage.input_grad_microbatch = mb;
  stage.slot_of_microbatch[mb] = -1;
  stage.free_slots.push_back(slot);
  ++stage.backwards_done;
  return absl::OkStatus();
}

absl::StatusOr<int> PipelineModel::CountCorrect(const float* x,
                                                const int32_t* labels,
                                                int batch) {
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineModel: batch must be >= 1, got ", batch));
  }
  RETURN_IF_ERROR(
      CheckBatch(kName, x, labels, batch, batch, num_classes()));
  transport_->Reset();
  const int num = num_stages();
  int correct = 0;
  // Forward only, one chunk at a time through every stage in turn; no
  // schedule is needed when nothing flows backwards.
  for (int start = 0; start < batch; start += max_microbatch_) {
    const int rows = std::min(max_microbatch_, batch - start);
    for (int s = 0; s < num; ++s) {
      Stage& stage = *stages_[s];
      auto& acts = stage.activations[0];
      if (s == 0) {
        RETURN_IF_ERROR(stage.backend->CopyFromHost(
            absl::MakeConstSpan(x + int64_t{start} * input_dim(),
                                size_t(rows) * input_dim()),
            acts[0].get(), 0));
      } else {
        RETURN_IF_ERROR(transport_->Recv({s - 1, s, Payload::kActivation, 0},
                                         acts[0]->data(),
                                         size_t(rows) * stage.in_dim()));
      }
      for (size_t l = 0; l < stage.layers.size(); ++l) {
        RETURN_IF_ERROR(stage.layers[l]->Forward(rows, acts[l]->data(),
                                                 acts[l + 1]->data()));
      }
      if (s + 1 < num) {
        RETURN_IF_ERROR(transport_->Send({s, s + 1, Payload::kActivation, 0},
                                         acts.back()->data(),
                                         size_t(rows) * stage.out_dim()));
        continue;
      }
      RETURN_IF_ERROR(stage.backend->CopyLabelsFromHost(
          absl::MakeConstSpan(labels + start, rows), stage.labels[0].get(),
          0));
      ASSIGN_OR_RETURN(int chunk_correct,
                       stage.backend->ArgmaxCorrect(rows, num_classes(),
                                                    acts.back()->data(),
                                                    stage.labels[0]->data()));
      correct += chunk_correct;
    }
  }
  return correct;
}

}  // namespace shardtrain::worker::pipeline
