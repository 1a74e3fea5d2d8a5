// Pipeline schedules as pure data, and a simulator that checks and times them.
//
// A model split into S contiguous stages trains on M microbatches per step.
// A schedule says, for each stage, the exact order of its operations:
// Forward(mb), Backward(mb), and the explicit sends/receives of activations
// (stage s -> s+1) and activation gradients (stage s+1 -> s) around them.
//
//   GPipe: every stage runs all M forwards, then all M backwards.
//   1F1B:  stage s runs min(S-1-s, M) warm-up forwards, then alternates one
//          forward and one backward, then drains the remaining backwards; a
//          stage keeps at most S-s microbatches of activations alive instead
//          of M.
//
// Communication semantics assumed by the schedules (and by StageTransport):
// a send never waits for its receiver (it is buffered), a receive waits for
// its message. Under those rules both schedules are deadlock-free, which
// Simulate() checks.
//
// Example:
//   Schedule schedule = MakeSchedule(ScheduleKind::k1F1B, 4, 8);
//   ASSIGN_OR_RETURN(Simulation sim, Simulate(schedule, TimeModel{}));
//   sim.bubble_fraction;  // 3 / 11 == TheoreticalBubbleFraction(4, 8)
#ifndef SHARDTRAIN_WORKER_MODEL_PIPELINE_SCHEDULE_H_
#define SHARDTRAIN_WORKER_MODEL_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::worker::pipeline {

enum class ScheduleKind { kGPipe, k1F1B };

// "gpipe" or "1f1b"; INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view text);
absl::string_view ScheduleKindName(ScheduleKind kind);

enum class OpType {
  kForward,
  kBackward,
  kSendActivation,  // To stage s+1, after Forward(mb).
  kRecvActivation,  // From stage s-1, before Forward(mb).
  kSendGrad,        // dL/d(input) to stage s-1, after Backward(mb).
  kRecvGrad,        // dL/d(output) from stage s+1, before Backward(mb).
};

struct Op {
  OpType type;
  int microbatch;

  bool operator==(const Op& other) const {
    return type == other.type && microbatch == other.microbatch;
  }
  bool operator!=(const Op& other) const { return !(*this == other); }
};

// E.g. "F3", "B0", "SendAct2", "RecvGrad1".
std::string OpName(const Op& op);

// schedule[s] is stage s's operations in execution order.
using Schedule = std::vector<std::vector<Op>>;

// The schedule for `stages` stages and `microbatches` microbatches.
// REQUIRES: stages >= 1 and microbatches >= 1 (an empty schedule otherwise).
Schedule MakeSchedule(ScheduleKind kind, int stages, int microbatches);

// OK if every stage holds each of its ops exactly once (Forward and Backward
// for every microbatch; sends/receives exactly where a neighbour exists),
// Backward(mb) comes after Forward(mb), each Forward/Backward is preceded by
// the receive it consumes and each send follows the compute that produces it.
// INVALID_ARGUMENT naming the first violation otherwise.
absl::Status ValidateSchedule(const Schedule& schedule, int microbatches);

// The cost of each operation in simulated time units. The GPipe paper's
// analysis uses forward == backward and free communication, which makes the
// bubble fraction (S-1)/(M+S-1) for both schedules.
struct TimeModel {
  double forward = 1.0;   // One microbatch forward through one stage.
  double backward = 1.0;  // One microbatch backward through one stage.
  double transfer = 0.0;  // From the end of a send to its message arriving.
};

struct TimedOp {
  Op op;
  double start;
  double end;
};

struct Simulation {
  // timeline[s] is stage s's ops in order with start/end times. A stage runs
  // one op at a time; an op starts when the previous op of its stage ended
  // and, for a receive, when its message has arrived. Sends and receives
  // take no stage time (the transfer cost sits between them).
  std::vector<std::vector<TimedOp>> timeline;
  // Time from 0 to the end of the last op of any stage.
  double total_time = 0;
  // 1 - (compute time of all stages) / (stages * total_time): the share of
  // stage-time spent idle.
  double bubble_fraction = 0;
  // Per stage, the most microbatches whose Forward has run and whose
  // Backward has not, i.e. whose activations must be kept.
  std::vector<int> peak_live_activations;
};

// Runs the schedule under `model`. INVALID_ARGUMENT if ValidateSchedule fails,
// FAILED_PRECONDITION if the schedule deadlocks (a receive whose message is
// never sent before the stages stall).
absl::StatusOr<Simulation> Simulate(const Schedule& schedule,
                                    const TimeModel& model);

// Per stage, the peak number of microbatches with live activations (the same
// as Simulation::peak_live_activations, without timing).
std::vector<int> PeakLiveActivations(const Schedule& schedule);

// (S-1) / (M+S-1): the idle share of a synchronous pipeline with equal
// forward and backward costs.
double TheoreticalBubbleFraction(int stages, int microbatches);

}  // namespace shardtrain::worker::pipeline

#endif  // SHARDTRAIN_WORKER_MODEL_PIPELINE_SCHEDULE_H_
