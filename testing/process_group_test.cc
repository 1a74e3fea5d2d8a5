#include "testing/process_group.h"

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/port_file.h"

namespace shardtrain::testutil {
namespace {

class ProcessGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("process_group_test");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Log() const { return dir_ + "/log"; }

  std::string dir_;
};

TEST_F(ProcessGroupTest, ExitCodeAndLogAreKeptAndAnsweredAgain) {
  ProcessGroup group;
  absl::StatusOr<pid_t> first = group.Start({"sh", "-c", "echo one; exit 3"}, Log());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<int> code = group.Wait(*first, absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  EXPECT_EQ(*group.Wait(*first, absl::ZeroDuration()), 3) << "asked again";
  // A second process appends to the same log, as a restarted server does.
  absl::StatusOr<pid_t> second = group.Start({"sh", "-c", "echo two"}, Log());
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(group.Wait(*second, absl::Seconds(10)).ok());
  EXPECT_EQ(ReadFile(Log()), "one\ntwo\n");
}

TEST_F(ProcessGroupTest, KillStopAndSignalsReachTheProcess) {
  ProcessGroup group;
  absl::StatusOr<pid_t> pid = group.Start({"sleep", "60"}, Log());
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(group.Wait(*pid, absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(group.Exited(*pid));
  ASSERT_TRUE(group.Kill(*pid).ok());
  EXPECT_EQ(*group.Wait(*pid, absl::ZeroDuration()), 128 + SIGKILL);
  EXPECT_EQ(group.Signal(*pid, SIGTERM).code(), absl::StatusCode::kNotFound)
      << "an exited process is not signalled (its PID may be reused)";

  // A stopped process still ends on Stop (SIGTERM, with SIGCONT).
  absl::StatusOr<pid_t> stopped = group.Start({"sleep", "60"}, Log());
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_TRUE(group.Signal(*stopped, SIGSTOP).ok());
  const absl::Time before = absl::Now();
  ASSERT_TRUE(group.Stop(*stopped).ok());
  EXPECT_LT(absl::Now() - before, absl::Seconds(4)) << "SIGTERM did not reach it";
  EXPECT_EQ(*group.Wait(*stopped, absl::ZeroDuration()), 128 + SIGTERM);
}

TEST_F(ProcessGroupTest, AProcessThatIgnoresSigtermIsKilledAfterTheGrace) {
  ProcessGroup group;
  absl::StatusOr<pid_t> pid =
      group.Start({"sh", "-c", "trap '' TERM; echo ready; sleep 60"}, Log());
  ASSERT_TRUE(pid.ok()) << pid.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadFile(Log()).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(group.Stop(*pid, absl::Milliseconds(200)).ok());
  EXPECT_EQ(*group.Wait(*pid, absl::ZeroDuration()), 128 + SIGKILL);
}

TEST_F(ProcessGroupTest, UnknownPidsAndBinariesAreRefused) {
  ProcessGroup group;
  EXPECT_EQ(group.Wait(1, absl::ZeroDuration()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(group.Signal(1, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(group.Start({dir_ + "/no-such-binary"}, Log()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(group.Start({}, Log()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ProcessGroupTest, TheGroupStopsWhatIsStillRunningWhenItGoes) {
  pid_t pid = 0;
  {
    ProcessGroup group;
    absl::StatusOr<pid_t> started = group.Start({"sleep", "60"}, Log());
    ASSERT_TRUE(started.ok()) << started.status();
    pid = *started;
  }
  // Reaped by the group: no such process (nor a zombie) is left.
  EXPECT_FALSE(std::filesystem::exists("/proc/" + std::to_string(pid) + "/stat") &&
               ReadFile("/proc/" + std::to_string(pid) + "/cmdline").find("sleep") !=
                   std::string::npos);
}

// Whether process `pid` is gone: no such process, or a zombie that nothing
// reaps (an orphan's new parent may not).
bool Gone(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const size_t end = stat.rfind(')');
  return end != std::string::npos && end + 2 < stat.size() && stat[end + 2] == 'Z';
}

// A test process that aborts (a failed CHECK) or is SIGKILLed (a test's
// timeout) runs no destructor: its processes must still die with it. One
// started from a thread that has ended lives on until then.
TEST_F(ProcessGroupTest, ProcessesDieWithTheProcessThatStartedThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The death test runs this test again in a new process, with a scratch
  // directory of its own: the file's name goes there by the environment.
  const std::string pid_file = dir_ + "/pids";
  if (getenv("PROCESS_GROUP_TEST_PIDS") == nullptr) {
    setenv("PROCESS_GROUP_TEST_PIDS", pid_file.c_str(), 1);
  }
  // The processes hold the death test's pipe (they inherit it): while one
  // lives, EXPECT_DEATH waits.
  const absl::Time start = absl::Now();
  EXPECT_DEATH(
      {
        ProcessGroup group;
        pid_t from_thread = 0;
        std::thread([&] { from_thread = *group.Start({"sleep", "60"}, Log()); }).join();
        const pid_t from_main = *group.Start({"sleep", "60"}, Log());
        absl::SleepFor(absl::Milliseconds(200));
        std::ofstream(getenv("PROCESS_GROUP_TEST_PIDS")) << from_thread << " " << from_main << " "
                                << (Gone(from_thread) ? "gone" : "alive") << "\n";
        std::abort();
      },
      "");
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "its processes outlived it";
  unsetenv("PROCESS_GROUP_TEST_PIDS");
  std::istringstream pids(ReadFile(pid_file));
  pid_t from_thread = 0;
  pid_t from_main = 0;
  std::string state;
  pids >> from_thread >> from_main >> state;
  ASSERT_GT(from_thread, 0);
  ASSERT_GT(from_main, 0);
  EXPECT_EQ(state, "alive") << "a process died with the thread that started it";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(Gone(from_thread) && Gone(from_main)) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(Gone(from_thread));
  EXPECT_TRUE(Gone(from_main));
  for (pid_t pid : {from_thread, from_main}) {
    if (!Gone(pid)) kill(pid, SIGKILL);
  }
}

TEST_F(ProcessGroupTest, WaitForPortsReadsThePortsOrTheLogOfAProcessThatDied) {
  ProcessGroup group;
  const std::string ports = dir_ + "/ports";
  absl::StatusOr<pid_t> server = group.Start(
      {"sh", "-c", "sleep 0.1; echo '4242 4343' > " + ports + ".tmp; mv " + ports + ".tmp " +
                       ports + "; sleep 60"},
      Log());
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::vector<int>> read = WaitForPorts(group, *server, ports, Log(),
                                                       absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (std::vector<int>{4242, 4343}));

  absl::StatusOr<pid_t> dies =
      group.Start({"sh", "-c", "echo cannot bind; exit 1"}, dir_ + "/dies.log");
  ASSERT_TRUE(dies.ok()) << dies.status();
  const absl::Time before = absl::Now();
  absl::StatusOr<std::vector<int>> none = WaitForPorts(
      group, *dies, dir_ + "/never", dir_ + "/dies.log", absl::Seconds(30));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("cannot bind"), absl::string_view::npos)
      << none.status();
  EXPECT_LT(absl::Now() - before, absl::Seconds(10)) << "it waited out the timeout";
}

}  // namespace
}  // namespace shardtrain::testutil
