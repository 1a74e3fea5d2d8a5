// ChainRouter: a worker's view of the chains of a replicated job
// (--replicas > 1), read from etcd and kept current by a watch.
//
// Replica group g's chain is the etcd key ChainKey(job, g)
// (chain/replication_keys.h) holding a ChainConfig (chain/chain_config.h):
// its epoch and members, head first. The router reads every chain once
// (Create), then watches the chains' prefix from the revision after that
// read, so it sees each compare-and-swap the shards make; Refresh re-reads
// one group's key at once, for a call a shard refused ("stale chain epoch").
// Route(group, role) answers from memory: the head (pushes) or tail (pulls)
// and the epoch to stamp on the request.
//
// When etcd cannot be reached the routes stay as last read: training goes
// on while etcd is down, and the watch resumes where it stopped once etcd is
// back (a watch that etcd ends for good, e.g. compacted, or an etcd that
// lost its data, is restarted from a fresh read). A chain replaces the one
// held when its epoch is later (or equal, read at a later revision).
// Values that do not decode or belong to another job size are logged and
// ignored.
//
//   ChainRouter::Options options;
//   options.etcd_endpoints = "10.0.0.5:2379";
//   options.job = "mnist";
//   options.num_groups = 4;
//   ASSIGN_OR_RETURN(std::unique_ptr<ChainRouter> router, ChainRouter::Create(options));
//   RETURN_IF_ERROR(router->WaitForGroups(4, absl::Seconds(30)));
//   ASSIGN_OR_RETURN(ChainRoute head, router->Route(2, ChainRole::kHead));
//   // push to shard head.shard with chain_epoch = head.epoch; if refused:
//   router->Refresh(2);
//
// Thread-safe. Owns two threads: the etcd watch's and one that runs
// Refresh's reads (so a gRPC completion never waits for etcd).
#ifndef SHARDTRAIN_CLIENT_CHAIN_ROUTER_H_
#define SHARDTRAIN_CLIENT_CHAIN_ROUTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chain/chain_config.h"
#include "client/ps_client_metrics.h"
#include "client/shard_channel.h"
#include "etcd/etcd_client.h"

namespace shardtrain::client {

class ChainRouter final : public ChainRoutes {
 public:
  struct Options {
    // Comma-separated etcd host:port list.
    std::string etcd_endpoints;
    // Null: plaintext to etcd; else TLS (app/etcd_flags.h).
    std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
    // The job's etcd namespace (chain::ValidateJobName).
    std::string job = "shardtrain";
    // Replica groups of the job: one per shard. Chains of other groups, or
    // naming shards beyond, are ignored.
    int num_groups = 1;
    // Deadline of each etcd read (and of connecting).
    absl::Duration etcd_timeout = absl::Seconds(1);
    // Refresh of one group re-reads etcd at most this often; more frequent
    // calls are answered from the last read.
    absl::Duration refresh_interval = absl::Milliseconds(50);
    // After a failed read, Refresh does not try etcd again for this long.
    absl::Duration etcd_down_backoff = absl::Seconds(1);
    // false: no watch, only Create's read and Refresh change the routes
    // (tests).
    bool watch = true;
  };

  // Connects to etcd and reads every chain of the job. UNAVAILABLE naming
  // the endpoints when etcd cannot be reached; INVALID_ARGUMENT for bad
  // options. `metrics` may be null; if not, it must outlive the router.
  static absl::StatusOr<std::unique_ptr<ChainRouter>> Create(const Options& options,
                                                             PsClientMetrics* metrics = nullptr);
  ~ChainRouter() override;
  ChainRouter(const ChainRouter&) = delete;
  ChainRouter& operator=(const ChainRouter&) = delete;

  // The shard playing `role` in `group`'s chain and the chain's epoch.
  // UNAVAILABLE when the group has no configuration yet; INVALID_ARGUMENT
  // for role kNone or a group out of range.
  absl::StatusOr<ChainRoute> Route(int group, ChainRole role) const override;
  // The group's configuration as last read; nullopt before the first.
  std::optional<chain::ChainConfig> Config(int group) const;
  // Every shard that is a member of some chain, ascending.
  std::vector<int> MemberShards() const;

  // Re-reads `group`'s chain from etcd, unless it was read within
  // refresh_interval (or etcd failed within etcd_down_backoff), then runs
  // `then` on the router's thread (or at once, on the caller's, when no
  // read is due). A failed read is logged (rate-limited) and keeps the
  // cached configuration.
  void Refresh(int group, std::function<void()> then) override;
  // Refresh and wait for it. REQUIRES: not called from a Refresh callback
  // (they run on the thread that would have to read).
  void Refresh(int group);
  // Refresh of every group, waited for. REQUIRES: as Refresh(group).
  void RefreshAll();

  // Runs `on_change` with every newer configuration the router adopts (a
  // watch event or a read), on the thread that read it and outside the
  // router's lock; replaces the previous one. ShardChannel::AbandonDeparted
  // listens here, so calls stuck on a member the chain dropped move on.
  void SetOnChange(std::function<void(const chain::ChainConfig&)> on_change);

  // Waits until groups 0..num_groups-1 all have a configuration.
  // DEADLINE_EXCEEDED naming the missing groups when `timeout` passes.
  absl::Status WaitForGroups(int num_groups, absl::Duration timeout);

  // Times the head, tail or members of a known chain changed (not counting
  // first reads).
  int64_t changes() const;
  // etcd reads Refresh made (tests).
  int64_t refresh_reads() const;

 private:
  // One group's chain as last read.
  struct Entry {
    chain::ChainConfig config;
    int64_t mod_revision = 0;  // of the etcd key: orders reads and events
  };

  ChainRouter(const Options& options, std::unique_ptr<etcd::EtcdClient> etcd,
              PsClientMetrics* metrics);

  // Adopts the value of chain key `key` read or watched at `mod_revision`,
  // if it is newer than what the router holds and valid. `source` names the
  // read for log lines.
  void Apply(const std::string& key, const std::string& value, int64_t mod_revision,
             const char* source) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads every chain; returns the store revision of the read.
  absl::StatusOr<int64_t> ReadAll();
  void StartWatch(int64_t from_revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The refresh thread: reads the groups asked for, restarts a watch that
  // etcd ended.
  void Loop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WarnEtcd(const absl::Status& status, const char* what) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const std::unique_ptr<etcd::EtcdClient> etcd_;
  PsClientMetrics* const metrics_;

  mutable absl::Mutex mu_;
  std::vector<std::optional<Entry>> entries_ ABSL_GUARDED_BY(mu_);  // by group
  // Refreshes asked for and not started: group -> callbacks to run after.
  std::map<int, std::vector<std::function<void()>>> pending_ ABSL_GUARDED_BY(mu_);
  // Refreshes being read now: their callbacks, and those that came meanwhile.
  std::map<int, std::vector<std::function<void()>>> reading_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> last_read_ ABSL_GUARDED_BY(mu_);  // by group
  absl::Time etcd_down_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool watch_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refresh_reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const chain::ChainConfig&)> on_change_ ABSL_GUARDED_BY(mu_);
  // Replaced only by the refresh thread (after a watch ended) and the
  // destructor; the watch's callbacks never touch it.
  std::unique_ptr<etcd::Watcher> watcher_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after everything above exists
};

// Routes the calls of `channels[g]` (shard g's channel, standing for
// replica group g) through `router` (ShardChannel::set_chain, with every
// channel as a peer), and cancels a group's calls stuck on a member its
// newer chain dropped (SetOnChange -> ShardChannel::AbandonDeparted). The
// channels must outlive the router.
void RouteChannels(ChainRouter* router, const std::vector<ShardChannel*>& channels);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_CHAIN_ROUTER_H_
