#include "worker/model/pipeline/schedule.h"

#include <map>
#include <utility>

#include "gtest/gtest.h"

namespace shardtrain::worker::pipeline {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B};

// End time of compute op (type, mb) on every stage, from a timeline.
std::map<std::tuple<int, OpType, int>, TimedOp> ComputeOps(
    const Simulation& sim) {
  std::map<std::tuple<int, OpType, int>, TimedOp> ops;
  for (int s = 0; s < static_cast<int>(sim.timeline.size()); ++s) {
    for (const TimedOp& t : sim.timeline[s]) {
      if (t.op.type == OpType::kForward || t.op.type == OpType::kBackward) {
        ops[{s, t.op.type, t.op.microbatch}] = t;
      }
    }
  }
  return ops;
}

// Time model: forward = backward = 1 unit per microbatch per stage, free
// communication (the GPipe paper's analysis).
TEST(ScheduleShape, AllSizesBothSchedules) {
  for (ScheduleKind kind : kKinds) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(testing::Message() << ScheduleKindName(kind) << " S="
                                        << stages << " M=" << m);
        const Schedule schedule = MakeSchedule(kind, stages, m);
        ASSERT_EQ(schedule.size(), size_t(stages));
        ASSERT_TRUE(ValidateSchedule(schedule, m).ok());

        // Every op exactly once: 2M compute ops plus one comm op per
        // compute op per existing neighbour.
        for (int s = 0; s < stages; ++s) {
          std::map<std::pair<OpType, int>, int> count;
          for (const Op& op : schedule[s]) ++count[{op.type, op.microbatch}];
          for (const auto& [op, n] : count) EXPECT_EQ(n, 1);
          const int neighbours = (s > 0) + (s + 1 < stages);
          EXPECT_EQ(schedule[s].size(), size_t(2 * m + 2 * m * neighbours));
        }

        absl::StatusOr<Simulation> sim = Simulate(schedule, TimeModel{});
        ASSERT_TRUE(sim.ok()) << sim.status();

        // Dependencies, checked on the timeline independently of the
        // simulator: F(s,mb) after F(s-1,mb); B(s,mb) after B(s+1,mb) and
        // after F(s,mb); one op at a time per stage.
        auto ops = ComputeOps(*sim);
        ASSERT_EQ(ops.size(), size_t(2 * stages * m));
        for (int s = 0; s < stages; ++s) {
          for (int mb = 0; mb < m; ++mb) {
            const TimedOp& f = ops.at({s, OpType::kForward, mb});
            const TimedOp& b = ops.at({s, OpType::kBackward, mb});
            EXPECT_GE(b.start, f.end);
            if (s > 0) {
              EXPECT_GE(f.start, ops.at({s - 1, OpType::kForward, mb}).end);
            }
            if (s + 1 < stages) {
              EXPECT_GE(b.start, ops.at({s + 1, OpType::kBackward, mb}).end);
            }
          }
          for (size_t i = 1; i < sim->timeline[s].size(); ++i) {
            EXPECT_GE(sim->timeline[s][i].start, sim->timeline[s][i - 1].end);
          }
        }

        // Activation memory.
        ASSERT_EQ(sim->peak_live_activations.size(), size_t(stages));
        for (int s = 0; s < stages; ++s) {
          if (kind == ScheduleKind::kGPipe) {
            EXPECT_EQ(sim->peak_live_activations[s], m);
          } else {
            EXPECT_EQ(sim->peak_live_activations[s], std::min(stages - s, m));
            EXPECT_LE(sim->peak_live_activations[s], stages);
          }
        }

        // Bubble: total time 2(M+S-1) units, bubble (S-1)/(M+S-1).
        EXPECT_DOUBLE_EQ(sim->total_time, 2.0 * (m + stages - 1));
        EXPECT_NEAR(sim->bubble_fraction,
                    TheoreticalBubbleFraction(stages, m), 1e-12);
      }
    }
  }
}

TEST(ScheduleShape, OneF1BWarmupAndSteadyState) {
  // S=3, M=4, stage 0: two warm-up forwards, then alternate, then drain.
  const Schedule schedule = MakeSchedule(ScheduleKind::k1F1B, 3, 4);
  std::vector<std::string> compute;
  for (const Op& op : schedule[0]) {
    if (op.type == OpType::kForward || op.type == OpType::kBackward) {
      compute.push_back(OpName(op));
    }
  }
  EXPECT_EQ(compute, (std::vector<std::string>{"F0", "F1", "F2", "B0", "F3",
                                               "B1", "B2", "B3"}));
  // The last stage alternates from the start, with its comm ops around.
  EXPECT_EQ(OpName(schedule[2][0]), "RecvAct0");
  EXPECT_EQ(OpName(schedule[2][1]), "F0");
  EXPECT_EQ(OpName(schedule[2][2]), "B0");
  EXPECT_EQ(OpName(schedule[2][3]), "SendGrad0");
}

TEST(ScheduleShape, UnequalCostsAndTransferLatency) {
  // Backward twice as slow as forward, then with transfer latency too.
  for (const TimeModel model : {TimeModel{1.0, 2.0, 0.0},
                                TimeModel{1.0, 2.0, 0.25}}) {
    const double unit = model.forward + model.backward;
    for (ScheduleKind kind : kKinds) {
      for (int stages = 2; stages <= 4; ++stages) {
        for (int m : {1, 4, 8}) {
          SCOPED_TRACE(::testing::Message()
                       << ScheduleKindName(kind) << " S=" << stages
                       << " M=" << m << " transfer=" << model.transfer);
          absl::StatusOr<Simulation> sim =
              Simulate(MakeSchedule(kind, stages, m), model);
          ASSERT_TRUE(sim.ok()) << sim.status();
          // Messages are received no earlier than transfer after the send.
          auto ops = ComputeOps(*sim);
          for (int s = 1; s < stages; ++s) {
            for (int mb = 0; mb < m; ++mb) {
              EXPECT_GE(ops.at({s, OpType::kForward, mb}).start,
                        ops.at({s - 1, OpType::kForward, mb}).end +
                            model.transfer);
              EXPECT_GE(ops.at({s - 1, OpType::kBackward, mb}).start,
                        ops.at({s, OpType::kBackward, mb}).end +
                            model.transfer);
            }
          }
          // Lower bounds: a stage's own work, and microbatch 0's round trip.
          EXPECT_GE(sim->total_time, m * unit - 1e-9);
          EXPECT_GE(sim->total_time,
                    stages * unit + 2 * (stages - 1) * model.transfer - 1e-9);
          // GPipe with free communication: (M+S-1) * (forward + backward).
          if (kind == ScheduleKind::kGPipe && model.transfer == 0) {
            EXPECT_DOUBLE_EQ(sim->total_time, (m + stages - 1) * unit);
          }
        }
      }
    }
  }
}

TEST(ScheduleShape, ValidateRejectsBrokenSchedules) {
  Schedule schedule = MakeSchedule(ScheduleKind::kGPipe, 2, 2);
  Schedule missing = schedule;
  missing[0].pop_back();
  EXPECT_EQ(ValidateSchedule(missing, 2).code(),
            absl::StatusCode::kInvalidArgument);
  Schedule duplicated = schedule;
  duplicated[1].push_back(duplicated[1].front());
  EXPECT_EQ(ValidateSchedule(duplicated, 2).code(),
            absl::StatusCode::kInvalidArgument);
  // Backward before forward on the last stage.
  Schedule reversed = schedule;
  std::swap(reversed[1][1], reversed[1][reversed[1].size() - 2]);
  EXPECT_FALSE(ValidateSchedule(reversed, 2).ok());
  EXPECT_TRUE(MakeSchedule(ScheduleKind::k1F1B, 0, 4).empty());
  EXPECT_TRUE(MakeSchedule(ScheduleKind::k1F1B, 2, 0).empty());
}

TEST(ScheduleShape, SimulateDetectsDeadlock) {
  // Stage 0 waits for gradient 0 before sending activation 0: valid order
  // locally, but no stage can move.
  Schedule schedule(2);
  schedule[0] = {{OpType::kForward, 0},
                 {OpType::kRecvGrad, 0},
                 {OpType::kSendActivation, 0},
                 {OpType::kBackward, 0}};
  schedule[1] = {{OpType::kRecvActivation, 0},
                 {OpType::kForward, 0},
                 {OpType::kBackward, 0},
                 {OpType::kSendGrad, 0}};
  ASSERT_TRUE(ValidateSchedule(schedule, 1).ok());
  EXPECT_EQ(Simulate(schedule, TimeModel{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ScheduleShape, ParseKind) {
  EXPECT_EQ(*ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseScheduleKind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(ParseScheduleKind("pipedream").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::worker::pipeline
