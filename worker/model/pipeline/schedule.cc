#include "worker/model/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace shardtrain::worker::pipeline {
namespace {

constexpr int kNumOpTypes = 6;

// Appends Forward(mb) with the receive before it and the send after it.
void AddForward(int stage, int stages, int mb, std::vector<Op>* ops) {
  if (stage > 0) ops->push_back({OpType::kRecvActivation, mb});
  ops->push_back({OpType::kForward, mb});
  if (stage + 1 < stages) ops->push_back({OpType::kSendActivation, mb});
}

void AddBackward(int stage, int stages, int mb, std::vector<Op>* ops) {
  if (stage + 1 < stages) ops->push_back({OpType::kRecvGrad, mb});
  ops->push_back({OpType::kBackward, mb});
  if (stage > 0) ops->push_back({OpType::kSendGrad, mb});
}

bool Expected(OpType type, int stage, int stages) {
  switch (type) {
    case OpType::kForward:
    case OpType::kBackward:
      return true;
    case OpType::kRecvActivation:
    case OpType::kSendGrad:
      return stage > 0;
    case OpType::kSendActivation:
    case OpType::kRecvGrad:
      return stage + 1 < stages;
  }
  return false;
}

// Where a message sent by `op` on `stage` arrives: (receiving stage, the
// receive op that consumes it).
std::pair<int, Op> Destination(int stage, const Op& op) {
  if (op.type == OpType::kSendActivation) {
    return {stage + 1, Op{OpType::kRecvActivation, op.microbatch}};
  }
  return {stage - 1, Op{OpType::kRecvGrad, op.microbatch}};
}

}  // namespace

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view text) {
  if (text == "gpipe") return ScheduleKind::kGPipe;
  if (text == "1f1b") return ScheduleKind::k1F1B;
  return absl::InvalidArgumentError(
      absl::StrCat("must be gpipe or 1f1b, got ", text));
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe ? "gpipe" : "1f1b";
}

std::string OpName(const Op& op) {
  static const char* const kNames[kNumOpTypes] = {
      "F", "B", "SendAct", "RecvAct", "SendGrad", "RecvGrad"};
  return absl::StrCat(kNames[static_cast<int>(op.type)], op.microbatch);
}

Schedule MakeSchedule(ScheduleKind kind, int stages, int microbatches) {
  if (stages < 1 || microbatches < 1) return {};
  Schedule schedule(stages);
  for (int s = 0; s < stages; ++s) {
    std::vector<Op>& ops = schedule[s];
    if (kind == ScheduleKind::kGPipe) {
      for (int mb = 0; mb < microbatches; ++mb) {
        AddForward(s, stages, mb, &ops);
      }
      for (int mb = 0; mb < microbatches; ++mb) {
        AddBackward(s, stages, mb, &ops);
      }
      continue;
    }
    // 1F1B: stage s can run S-1-s forwards before the first gradient can
    // possibly come back from the last stage.
    const int warmup = std::min(stages - 1 - s, microbatches);
    int next_forward = 0;
    int next_backward = 0;
    while (next_forward < warmup) AddForward(s, stages, next_forward++, &ops);
    while (next_forward < microbatches) {
      AddForward(s, stages, next_forward++, &ops);
      AddBackward(s, stages, next_backward++, &ops);
    }
    while (next_backward < microbatches) {
      AddBackward(s, stages, next_backward++, &ops);
    }
  }
  return schedule;
}

absl::Status ValidateSchedule(const Schedule& schedule, int microbatches) {
  const int stages = static_cast<int>(schedule.size());
  if (stages < 1 || microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: need >= 1 stage and microbatch, got ", stages,
                     " and ", microbatches));
  }
  for (int s = 0; s < stages; ++s) {
    // position[type][mb], -1 while unseen.
    std::vector<std::vector<int>> position(
        kNumOpTypes, std::vector<int>(microbatches, -1));
    const std::vector<Op>& ops = schedule[s];
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& op = ops[i];
      if (op.microbatch < 0 || op.microbatch >= microbatches) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule: stage ", s, " op ", OpName(op),
                         " names a microbatch outside [0, ", microbatches,
                         ")"));
      }
      if (!Expected(op.type, s, stages)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schedule: stage ", s, " of ", stages, " cannot run ", OpName(op)));
      }
      int& slot = position[static_cast<int>(op.type)][op.microbatch];
      if (slot >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule: stage ", s, " runs ", OpName(op), " twice"));
      }
      slot = i;
    }
    for (int t = 0; t < kNumOpTypes; ++t) {
      const OpType type = static_cast<OpType>(t);
      if (!Expected(type, s, stages)) continue;
      for (int mb = 0; mb < microbatches; ++mb) {
        if (position[t][mb] < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("schedule: stage ", s, " never runs ",
                           OpName(Op{type, mb})));
        }
      }
    }
    // Ordering inside the stage: (before, after) pairs that must hold.
    const std::pair<OpType, OpType> kOrder[] = {
        {OpType::kRecvActivation, OpType::kForward},
        {OpType::kForward, OpType::kSendActivation},
        {OpType::kForward, OpType::kBackward},
        {OpType::kRecvGrad, OpType::kBackward},
        {OpType::kBackward, OpType::kSendGrad},
    };
    for (const auto& [before, after] : kOrder) {
      if (!Expected(before, s, stages) || !Expected(after, s, stages)) continue;
      for (int mb = 0; mb < microbatches; ++mb) {
        if (position[static_cast<int>(before)][mb] >
            position[static_cast<int>(after)][mb]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "schedule: stage ", s, " runs ", OpName(Op{after, mb}),
              " before ", OpName(Op{before, mb})));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Simulation> Simulate(const Schedule& schedule,
                                    const TimeModel& model) {
  const int stages = static_cast<int>(schedule.size());
  int microbatches = 0;
  if (stages > 0) {
    for (const Op& op : schedule[0]) {
      microbatches = std::max(microbatches, op.microbatch + 1);
    }
  }
  if (absl::Status status = ValidateSchedule(schedule, microbatches);
      !status.ok()) {
    return status;
  }

  Simulation sim;
  sim.timeline.resize(stages);
  std::vector<size_t> next(stages, 0);
  std::vector<double> clock(stages, 0.0);
  // (receiving stage, op type, microbatch) -> arrival time.
  std::map<std::tuple<int, int, int>, double> arrivals;
  size_t remaining = 0;
  for (const auto& ops : schedule) remaining += ops.size();

  // Each op's times depend only on ops before it, so sweeping the stages
  // until none can move gives the same result in any sweep order.
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < stages; ++s) {
      bool blocked = false;
      while (!blocked && next[s] < schedule[s].size()) {
        const Op& op = schedule[s][next[s]];
        double start = clock[s];
        double end = start;
        switch (op.type) {
          case OpType::kForward:
            end = start + model.forward;
            break;
          case OpType::kBackward:
            end = start + model.backward;
            break;
          case OpType::kRecvActivation:
          case OpType::kRecvGrad: {
            auto it = arrivals.find({s, static_cast<int>(op.type),
                                     op.microbatch});
            if (it == arrivals.end()) {
              blocked = true;
              break;
            }
            start = end = std::max(start, it->second);
            break;
          }
          case OpType::kSendActivation:
          case OpType::kSendGrad: {
            const auto [dst, recv] = Destination(s, op);
            arrivals[{dst, static_cast<int>(recv.type), recv.microbatch}] =
                start + model.transfer;
            break;
          }
        }
        if (blocked) break;
        sim.timeline[s].push_back({op, start, end});
        clock[s] = end;
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      for (int s = 0; s < stages; ++s) {
        if (next[s] < schedule[s].size()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "schedule deadlocks: stage ", s, " waits forever in ",
              OpName(schedule[s][next[s]])));
        }
      }
    }
  }

  for (int s = 0; s < stages; ++s) {
    sim.total_time = std::max(sim.total_time, clock[s]);
  }
  const double busy =
      double(stages) * microbatches * (model.forward + model.backward);
  sim.bubble_fraction =
      sim.total_time > 0 ? 1.0 - busy / (stages * sim.total_time) : 0.0;
  sim.peak_live_activations = PeakLiveActivations(schedule);
  return sim;
}

std::vector<int> PeakLiveActivations(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const std::vector<Op>& ops : schedule) {
    int live = 0;
    int peak = 0;
    for (const Op& op : ops) {
      if (op.type == OpType::kForward) peak = std::max(peak, ++live);
      if (op.type == OpType::kBackward) --live;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

double TheoreticalBubbleFraction(int stages, int microbatches) {
  return double(stages - 1) / double(microbatches + stages - 1);
}

}  // namespace shardtrain::worker::pipeline
