// FakeShard: a parameter-server shard in this process that speaks the
// protocol (proto/shardtrain.proto) over an in-process gRPC channel, for
// unit tests of PsClient (client/ps_client_test.cc) without shard
// processes or ports.
//
// It keeps what a shard keeps, simply: the partitions of shard `index` of
// `num_shards` (common::PlaceTensor), each with values (zeros), a version
// (updates applied) and plain SGD at learning rate 1 (a push subtracts its
// gradient, dense or top-k sparse, f32/f16/bf16); it applies each (worker,
// worker_incarnation, sequence) once and refuses a request naming another
// incarnation of it with ABORTED, as a shard does. A pull is answered at
// once in the dtype it asks for. It does not park pulls, run sync steps or
// bound staleness: those are the server's and are tested there.
//
// What a test stages: the next calls of a method failing with a code
// before anything is applied (FailNext) or after the push was applied, as
// a lost answer looks (LoseNextAnswers); a restart (Restart: a new
// incarnation, versions rolled back). What it reads: every push as
// received, the calls of each method, the partitions' values and versions.
//
//   FakeShard shard(/*index=*/0, /*num_shards=*/1, /*max_partition_elements=*/4);
//   options.connect = [&](int, int) { return shard.Channel(); };
//   shard.FailNext("Push", 2, grpc::StatusCode::UNAVAILABLE);
//
// Thread-safe.
#ifndef SHARDTRAIN_CLIENT_TESTING_FAKE_SHARD_H_
#define SHARDTRAIN_CLIENT_TESTING_FAKE_SHARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client::testing {

class FakeShard final : public ParameterServer::CallbackService {
 public:
  FakeShard(int index, int num_shards, int64_t max_partition_elements);
  ~FakeShard() override;

  // A new in-process channel to this shard (each a connection of its own).
  std::shared_ptr<grpc::Channel> Channel();

  // The next `count` calls of `method` ("Register", "Push", "Pull",
  // "PushPull", "Heartbeat") end with `code`, changing nothing.
  void FailNext(const std::string& method, int count, grpc::StatusCode code);
  // The next `count` pushes (Push, or PushPull's push) are applied and then
  // answered UNAVAILABLE, as when the answer is lost on the way.
  void LoseNextAnswers(int count);
  // A restart from a checkpoint taken `lost` applied pushes ago: a new
  // incarnation, and the values, versions and push log as they were then.
  void Restart(int lost);

  // Whether Register answers counts_clock_parts (a shard that moves a
  // worker's clock once every call of a split push is in); false, as an
  // older shard, until set.
  void set_counts_clock_parts(bool counts) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t incarnation() const;
  // Calls of `method` that reached this shard, refused ones included.
  int calls(const std::string& method) const;
  // Every push received (PushPull's push half included), in order,
  // refused and duplicate ones included.
  std::vector<PushRequest> pushes() const;
  // Pushes applied (not refused, not duplicates).
  int applied() const;
  // Partition `partition` of `tensor`: its values and version; empty and 0
  // when this shard does not hold it.
  std::vector<float> values(const std::string& tensor, int64_t partition) const;
  int64_t version(const std::string& tensor, int64_t partition) const;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const PushRequest* request, PushResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const PullRequest* request, PullResponse* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const PushPullRequest* request,
                                     PushPullResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;

 private:
  struct Part {
    std::vector<float> values;
    int64_t version = 0;
  };
  using Key = std::pair<std::string, int64_t>;
  // What a checkpoint holds.
  struct State {
    std::map<Key, Part> parts;
    // (worker, worker_incarnation, sequence) of the pushes applied.
    std::set<std::tuple<uint32_t, uint64_t, uint64_t>> sequences;
  };

  // Counts the call; the scripted failure for it, or OK.
  grpc::Status Admit(const std::string& method) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks and applies a push (all parts or none).
  grpc::Status ApplyPush(const PushRequest& request, PushResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  grpc::Status FillPull(const PullRequest& request, PullResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                          const grpc::Status& status);

  const int index_;
  const int num_shards_;
  const int64_t max_partition_elements_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
  bool counts_clock_parts_ ABSL_GUARDED_BY(mu_) = false;
  State state_ ABSL_GUARDED_BY(mu_);
  // The state before each applied push, oldest first (for Restart).
  std::vector<State> history_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<grpc::StatusCode>> failures_ ABSL_GUARDED_BY(mu_);
  int lose_answers_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<PushRequest> pushes_ ABSL_GUARDED_BY(mu_);
  int applied_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::client::testing

#endif  // SHARDTRAIN_CLIENT_TESTING_FAKE_SHARD_H_
