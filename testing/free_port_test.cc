#include "testing/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "gtest/gtest.h"

namespace shardtrain::testutil {
namespace {

TEST(FreePortTest, PicksBindablePortsBelowTheEphemeralRange) {
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<int> port = PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_LT(*port, EphemeralPortLow());
    EXPECT_GT(*port, 0);
    seen.insert(*port);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(*port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << *port;
    close(fd);
  }
  EXPECT_GT(seen.size(), 10u) << "picks should spread over the range";
}

}  // namespace
}  // namespace shardtrain::testutil
