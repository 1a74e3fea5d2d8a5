#include "testing/net_ns.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "testing/files.h"

namespace shardtrain::testutil {
namespace {

absl::Status Run(const std::string& command) {
  const std::string out = MakeTempDir("shardtrain-ip-");
  const int rc = std::system((command + " >" + out + "/log 2>&1").c_str());
  const std::string log = ReadFile(out + "/log");
  std::filesystem::remove_all(out);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("`", command, "` failed: ", log));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetNs>> NetNs::Create() {
  const int id = static_cast<int>(getpid() % 200) + 20;
  std::unique_ptr<NetNs> ns(new NetNs(id));
  for (const std::string& command : {
           "ip netns add " + ns->name_,
           absl::StrCat("ip link add ", ns->host_if_, " type veth peer name ", ns->ns_if_,
                        " netns ", ns->name_),
           absl::StrCat("ip addr add ", ns->host_addr_, "/30 dev ", ns->host_if_),
           "ip link set " + ns->host_if_ + " up",
           absl::StrCat("ip -n ", ns->name_, " addr add ", ns->ns_addr_, "/30 dev ", ns->ns_if_),
           absl::StrCat("ip -n ", ns->name_, " link set ", ns->ns_if_, " up"),
           absl::StrCat("ip -n ", ns->name_, " link set lo up")}) {
    absl::Status status = Run(command);
    if (!status.ok()) return status;
  }
  return ns;
}

NetNs::NetNs(int id)
    : name_(absl::StrCat("shardtrain-part-", getpid())),
      host_if_(absl::StrCat("stp", getpid() % 100000, "h")),
      ns_if_(absl::StrCat("stp", getpid() % 100000, "n")),
      host_addr_(absl::StrCat("10.200.", id, ".1")),
      ns_addr_(absl::StrCat("10.200.", id, ".2")) {}

NetNs::~NetNs() {
  (void)Run("ip netns del " + name_);
  (void)Run("ip link del " + host_if_ + " 2>/dev/null || true");
}

absl::Status NetNs::SetLink(bool up) {
  return Run(absl::StrCat("ip -n ", name_, " link set ", ns_if_, up ? " up" : " down"));
}

absl::Status NetNs::SetPortOpen(int port, bool open) {
  return Run(absl::StrCat("ip netns exec ", name_, " iptables ", open ? "-D" : "-I",
                          " INPUT -p tcp --dport ", port, " -j DROP"));
}

}  // namespace shardtrain::testutil
