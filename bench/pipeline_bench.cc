// pipeline_bench: the measured bubble fraction of the GPipe and 1F1B
// schedules, next to the theoretical (S-1)/(M+S-1).
//
// Each stage runs its schedule (worker/model/pipeline/schedule.h) on its own thread
// with its own CPU backend; activations and their gradients cross stages
// through LocalTransport, exactly as PipelineModel moves them. Every Forward
// and Backward op does the same fixed amount of work, matching the time
// model of the formula (forward == backward, cheap communication):
//   --work=gemm   one n x n x n OpenBLAS GEMM per op (single-threaded BLAS).
//                 Real compute, but stages share the machine's cores, so use
//                 S <= cores (S=2 on a 2-core machine).
//   --work=sleep  each op sleeps --op_us, standing in for a GPU kernel: the
//                 host thread is idle, so S > cores still measures the
//                 schedule and transport, not core contention.
// Measured: T = wall time of one step (all stages, median of --reps),
// busy_s = time stage s spent inside Forward/Backward ops; bubble =
// 1 - sum_s busy_s / (S * T). The baseline is the same ops with S=1 (no
// pipeline, no transport), reported as ideal_speedup = serial time / T.
//
// Usage:
//   pipeline_bench --out=bench/results/pipeline_cpu.txt
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "app/deadlock_detection.h"
#include "common/status_macros.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/pipeline/schedule.h"
#include "worker/model/pipeline/transport.h"

ABSL_FLAG(std::string, out, "", "Write the results table to this file too.");
ABSL_FLAG(int, reps, 7, "Timed steps per configuration (median reported).");
ABSL_FLAG(int, gemm_n, 192, "Matrix size of the GEMM each op runs (gemm).");
ABSL_FLAG(int, op_us, 2000, "Duration of each op in microseconds (sleep).");
ABSL_FLAG(int, message_floats, 64 * 256,
          "Floats per activation / gradient message.");

namespace shardtrain::worker::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

enum class Work { kGemm, kSleep };

// One stage's resources: a backend, GEMM operands, message buffers.
struct BenchStage {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceBuffer> a, b, c;
  std::unique_ptr<DeviceBuffer> message;
};

struct StepTimes {
  double total = 0;               // Wall time of the step.
  std::vector<double> busy;       // Per stage, inside Forward/Backward.
};

absl::Status DoWork(Work work, BenchStage& stage) {
  if (work == Work::kSleep) {
    std::this_thread::sleep_for(
        std::chrono::microseconds(absl::GetFlag(FLAGS_op_us)));
    return absl::OkStatus();
  }
  const int n = absl::GetFlag(FLAGS_gemm_n);
  return stage.backend->Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.0f,
                             stage.a->data(), stage.b->data(), 0.0f,
                             stage.c->data());
}

absl::Status RunStage(int s, const std::vector<Op>& ops, Work work,
                      BenchStage& stage, StageTransport& transport,
                      double* busy) {
  const size_t n = absl::GetFlag(FLAGS_message_floats);
  float* buffer = stage.message->data();
  for (const Op& op : ops) {
    const int mb = op.microbatch;
    switch (op.type) {
      case OpType::kForward:
      case OpType::kBackward: {
        const Clock::time_point start = Clock::now();
        RETURN_IF_ERROR(DoWork(work, stage));
        *busy += Seconds(Clock::now() - start);
        break;
      }
      case OpType::kSendActivation:
        RETURN_IF_ERROR(
            transport.Send({s, s + 1, Payload::kActivation, mb}, buffer, n));
        break;
      case OpType::kRecvActivation:
        RETURN_IF_ERROR(
            transport.Recv({s - 1, s, Payload::kActivation, mb}, buffer, n));
        break;
      case OpType::kSendGrad:
        RETURN_IF_ERROR(transport.Send(
            {s, s - 1, Payload::kActivationGrad, mb}, buffer, n));
        break;
      case OpType::kRecvGrad:
        RETURN_IF_ERROR(transport.Recv(
            {s + 1, s, Payload::kActivationGrad, mb}, buffer, n));
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepTimes> RunStep(const Schedule& schedule, Work work,
                                  std::vector<BenchStage>& stages,
                                  StageTransport& transport) {
  const int num = static_cast<int>(schedule.size());
  transport.Reset();
  StepTimes times;
  times.busy.assign(num, 0.0);
  std::vector<absl::Status> results(num);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < num; ++s) {
    threads.emplace_back([&, s] {
      results[s] = RunStage(s, schedule[s], work, stages[s], transport,
                            &times.busy[s]);
      if (!results[s].ok()) transport.Cancel();
    });
  }
  for (std::thread& t : threads) t.join();
  times.total = Seconds(Clock::now() - start);
  for (const absl::Status& status : results) RETURN_IF_ERROR(status);
  return times;
}

absl::StatusOr<std::vector<BenchStage>> MakeStages(int num) {
  const int n = absl::GetFlag(FLAGS_gemm_n);
  std::vector<BenchStage> stages(num);
  for (BenchStage& stage : stages) {
    stage.backend = MakeCpuBackend();
    ASSIGN_OR_RETURN(stage.a, stage.backend->Allocate(size_t(n) * n));
    ASSIGN_OR_RETURN(stage.b, stage.backend->Allocate(size_t(n) * n));
    ASSIGN_OR_RETURN(stage.c, stage.backend->Allocate(size_t(n) * n));
    ASSIGN_OR_RETURN(stage.message, stage.backend->Allocate(
                                        absl::GetFlag(FLAGS_message_floats)));
    std::vector<float> ones(size_t(n) * n, 0.5f);
    RETURN_IF_ERROR(stage.backend->CopyFromHost(ones, stage.a.get(), 0));
    RETURN_IF_ERROR(stage.backend->CopyFromHost(ones, stage.b.get(), 0));
  }
  return stages;
}

// Median over reps of (step time, bubble), after one warm-up step.
absl::StatusOr<std::pair<double, double>> Measure(ScheduleKind kind,
                                                  int num_stages, int m,
                                                  Work work) {
  ASSIGN_OR_RETURN(std::vector<BenchStage> stages, MakeStages(num_stages));
  std::vector<Backend*> backends;
  for (BenchStage& stage : stages) backends.push_back(stage.backend.get());
  ASSIGN_OR_RETURN(std::unique_ptr<LocalTransport> transport,
                   LocalTransport::Create(backends));
  const Schedule schedule = MakeSchedule(kind, num_stages, m);
  std::vector<std::pair<double, double>> samples;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_reps); ++rep) {
    ASSIGN_OR_RETURN(StepTimes t, RunStep(schedule, work, stages, *transport));
    if (rep == 0) continue;
    double busy = 0;
    for (double b : t.busy) busy += b;
    samples.push_back({t.total, 1.0 - busy / (num_stages * t.total)});
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

absl::Status Run() {
  SetCpuMathThreads(1);
  struct Config {
    Work work;
    int stages;
    std::vector<int> microbatches;
  };
  const std::vector<Config> configs = {
      {Work::kGemm, 2, {1, 2, 4, 8}},
      {Work::kSleep, 2, {1, 4, 8}},
      {Work::kSleep, 4, {1, 4, 8, 16}},
  };
  std::string report = absl::StrFormat(
      "# pipeline_bench: measured vs theoretical bubble (S-1)/(M+S-1)\n"
      "# gemm: one %dx%dx%d sgemm per op; sleep: %d us per op; message %d "
      "floats; median of %d steps\n"
      "%-6s %-6s %2s %3s %10s %10s %9s %9s %8s\n",
      absl::GetFlag(FLAGS_gemm_n), absl::GetFlag(FLAGS_gemm_n),
      absl::GetFlag(FLAGS_gemm_n), absl::GetFlag(FLAGS_op_us),
      absl::GetFlag(FLAGS_message_floats), absl::GetFlag(FLAGS_reps), "work",
      "sched", "S", "M", "step_ms", "serial_ms", "measured", "theory",
      "speedup");
  std::fputs(report.c_str(), stdout);
  for (const Config& config : configs) {
    const char* work_name = config.work == Work::kGemm ? "gemm" : "sleep";
    for (int m : config.microbatches) {
      // Baseline in the same run: the same 2*S*M ops on one stage.
      ASSIGN_OR_RETURN(auto serial,
                       Measure(ScheduleKind::kGPipe, 1, m * config.stages,
                               config.work));
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        ASSIGN_OR_RETURN(auto measured,
                         Measure(kind, config.stages, m, config.work));
        const std::string line = absl::StrFormat(
            "%-6s %-6s %2d %3d %10.2f %10.2f %9.3f %9.3f %8.2f\n", work_name,
            std::string(ScheduleKindName(kind)), config.stages, m,
            measured.first * 1e3, serial.first * 1e3, measured.second,
            TheoreticalBubbleFraction(config.stages, m),
            serial.first / measured.first);
        std::fputs(line.c_str(), stdout);
        std::fflush(stdout);
        report += line;
      }
    }
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::ofstream file(out);
    file << report;
    if (!file) return absl::UnavailableError("cannot write " + out);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain::worker::pipeline

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  absl::ParseCommandLine(argc, argv);
  absl::Status status = shardtrain::worker::pipeline::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
