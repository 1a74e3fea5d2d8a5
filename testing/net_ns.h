// NetNs: a network namespace joined to this one by a veth pair with private
// addresses (10.200.N.1 here, 10.200.N.2 inside), for tests that cut a
// process off the network: start it under Exec(), then SetLink(false) and
// SetLink(true), or silence one port with SetPortOpen. Needs root (ip
// netns); Create fails otherwise, and tests skip. The namespace and its
// link are deleted with the object.
//
//   absl::StatusOr<std::unique_ptr<NetNs>> ns = NetNs::Create();
//   if (!ns.ok()) GTEST_SKIP() << ns.status();
//   argv = (*ns)->Exec() + {binary, "--listen=" + (*ns)->ns_addr() + ":PORT"};
//   ASSERT_TRUE((*ns)->SetLink(false).ok());  // cut off
#ifndef SHARDTRAIN_TESTING_NET_NS_H_
#define SHARDTRAIN_TESTING_NET_NS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::testutil {

class NetNs {
 public:
  static absl::StatusOr<std::unique_ptr<NetNs>> Create();
  ~NetNs();
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;

  // Brings the namespace's end of the link down (nothing goes in or out,
  // and no reset tells the peers) or up again.
  absl::Status SetLink(bool up);
  // Drops (open = false) or lets in again (true) the TCP segments that come
  // into the namespace for `port`: a server listening there stops answering
  // (no reset), while connections it made itself (an etcd lease) go on.
  // Needs iptables.
  absl::Status SetPortOpen(int port, bool open);
  // Put in front of a command line to run it inside the namespace.
  std::vector<std::string> Exec() const { return {"/usr/sbin/ip", "netns", "exec", name_}; }
  // This side's address, and the namespace's.
  const std::string& host_addr() const { return host_addr_; }
  const std::string& ns_addr() const { return ns_addr_; }

 private:
  explicit NetNs(int id);

  std::string name_, host_if_, ns_if_, host_addr_, ns_addr_;
};

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_NET_NS_H_
