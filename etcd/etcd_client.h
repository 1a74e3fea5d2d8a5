// EtcdClient: a small client for etcd's v3 gRPC API (KV, Lease, Watch),
// enough for replicated shards to keep leases, change a replica group's
// configuration by compare-and-swap and watch it.
//
//   EtcdClient::Options options;
//   options.endpoints = "10.0.0.5:2379,10.0.0.6:2379";
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Create(options));
//   ASSERT_OK_AND_ASSIGN(Lease lease, etcd->GrantLease(absl::Seconds(5)));
//   auto keeper = etcd->KeepLeaseAlive(lease, [](absl::Status s) { ... });
//   ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd->Get("/chain/0"));
//   ASSERT_OK_AND_ASSIGN(CasResult cas,
//                        etcd->CompareAndSwap("/chain/0", kv.mod_revision, next, lease.id));
//   if (!cas.succeeded) { /* someone else changed it: re-read cas.current */ }
//   auto watcher = etcd->Watch("/chain/", cas.revision + 1,
//                              [](const WatchEvent& e) { ... });
//
// Every call carries a deadline (Options::rpc_timeout); when etcd cannot be
// reached a call fails with UNAVAILABLE or DEADLINE_EXCEEDED naming the
// endpoint, and the next call goes to the next member listed in
// Options::endpoints (not repeated by the client: a failed write may or may
// not have been applied). etcd's own refusals keep etcd's code and message.
//
// EtcdClient is thread-safe. LeaseKeeper and Watcher (lease_keeper.h,
// watcher.h) each own one thread and share the connection, so they may
// outlive the client.
#ifndef SHARDTRAIN_ETCD_ETCD_CLIENT_H_
#define SHARDTRAIN_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/lease_keeper.h"
#include "etcd/watcher.h"

namespace shardtrain::etcd {

namespace internal {
class Connection;
}  // namespace internal

// One key as etcd stores it.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  // The revision of the last change; the token for CompareAndSwap.
  int64_t mod_revision = 0;
  // Number of changes since creation (1 after the first put).
  int64_t version = 0;
  // The lease the key is attached to (0: none).
  int64_t lease = 0;
};

// The keys under a prefix and the store's revision they were read at (a
// Watch from revision + 1 misses nothing that happened after the read).
struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;
};

// The outcome of CompareAndSwap.
struct CasResult {
  // True when the key had the expected mod_revision and now holds the new value.
  bool succeeded = false;
  // On success: the key's new mod_revision. On failure: the store's revision.
  int64_t revision = 0;
  // On failure: the key as it is now (nullopt when it does not exist).
  std::optional<KeyValue> current;
};

class EtcdClient {
 public:
  struct Options {
    // Comma-separated host:port list of the cluster's members. Calls go to
    // the first one that accepts a connection within connect_timeout, and
    // move on to the next one listed when a call to it fails as a dead or
    // cut-off member's do (internal/connection.h).
    std::string endpoints = "127.0.0.1:2379";
    // Deadline of every unary call and of each lease keep-alive round.
    absl::Duration rpc_timeout = absl::Seconds(2);
    // How long Create waits for each endpoint to accept a connection.
    absl::Duration connect_timeout = absl::Seconds(2);
    // Upper bound of gRPC's reconnect backoff: how late the client notices
    // that a restarted etcd is back.
    absl::Duration max_reconnect_backoff = absl::Seconds(1);
    // How to reach etcd: null for plaintext; TLS credentials (verifying
    // etcd's certificate, and presenting this client's when etcd runs with
    // --client-cert-auth) for an etcd that serves https.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
  };

  // Connects to the first reachable endpoint. UNAVAILABLE when none is.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const Options& options);

  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The endpoint calls go to now.
  const std::string& endpoint() const;

  // The key, NOT_FOUND when absent.
  absl::StatusOr<KeyValue> Get(absl::string_view key);
  // Every key starting with prefix (all keys for ""), sorted by key.
  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix);
  // Sets key to value, attached to lease (0: none). Returns the new revision.
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease = 0);
  // Deletes key. Returns whether it existed.
  absl::StatusOr<bool> Delete(absl::string_view key);

  // Sets key to new_value only if its mod_revision is still
  // expected_mod_revision (0: only if the key does not exist), in one etcd
  // transaction. A lost race is not an error: succeeded is false and
  // current says what the key holds now.
  absl::StatusOr<CasResult> CompareAndSwap(absl::string_view key,
                                           int64_t expected_mod_revision,
                                           absl::string_view new_value, int64_t lease = 0);

  // A lease of at least ttl (etcd may round it up; Lease::ttl is what it granted).
  absl::StatusOr<Lease> GrantLease(absl::Duration ttl);
  // Ends the lease now; the keys attached to it are deleted.
  absl::Status RevokeLease(int64_t lease_id);
  // Keeps the lease alive until the keeper is destroyed or the lease is
  // lost (on_lost is then called once, on the keeper's thread).
  std::unique_ptr<LeaseKeeper> KeepLeaseAlive(const Lease& lease,
                                              LeaseKeeper::LossCallback on_lost);

  // REQUIRES: on_event is callable.
  // Delivers every put and delete under prefix from start_revision on
  // (0: from now), in revision order, on the watcher's thread, across etcd
  // restarts. on_error (optional) hears why the watch ended for good, e.g.
  // start_revision was compacted away.
  std::unique_ptr<Watcher> Watch(absl::string_view prefix, int64_t start_revision,
                                 Watcher::EventCallback on_event,
                                 Watcher::ErrorCallback on_error = nullptr);

 private:
  explicit EtcdClient(std::shared_ptr<internal::Connection> connection);

  // Constant after construction; shared with keepers and watchers.
  const std::shared_ptr<internal::Connection> connection_;
};

// The first key after every key with this prefix ("\0" for the empty prefix
// or one of only 0xff bytes: to the end of the key space), as etcd's
// range_end expects.
std::string PrefixRangeEnd(absl::string_view prefix);

}  // namespace shardtrain::etcd

#endif  // SHARDTRAIN_ETCD_ETCD_CLIENT_H_
