#include "common/reconnect.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

// A DNS server on 127.0.0.1 that never answers the first socket that asks
// (every query from its source port is dropped, resends included, as a
// stale connection-tracking entry drops them) and answers every other with
// 127.0.0.1 (A) or no address (AAAA).
class DeafToFirstSocketDns {
 public:
  DeafToFirstSocketDns() {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "no UDP socket on 127.0.0.1";
      return;
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }

  ~DeafToFirstSocketDns() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }

  int port() const { return port_; }

  // Source ports that sent queries, and those answered.
  int sockets_seen() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(ports_.size());
  }
  int answered() const {
    absl::MutexLock lock(&mu_);
    return answered_;
  }

 private:
  void Serve() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      pollfd readable{fd_, POLLIN, 0};
      if (poll(&readable, 1, 50) <= 0) continue;
      uint8_t query[512];
      sockaddr_in from{};
      socklen_t from_length = sizeof(from);
      const ssize_t n = recvfrom(fd_, query, sizeof(query), 0,
                                 reinterpret_cast<sockaddr*>(&from), &from_length);
      if (n < 12) continue;
      const int from_port = ntohs(from.sin_port);
      {
        absl::MutexLock lock(&mu_);
        ports_.insert(from_port);
        if (first_port_ == 0) first_port_ = from_port;
        if (from_port == first_port_) continue;
      }
      // The question: labels up to the root, then type and class.
      size_t end = 12;
      while (end < static_cast<size_t>(n) && query[end] != 0) end += query[end] + 1;
      end += 5;
      if (end > static_cast<size_t>(n)) continue;
      const bool a = query[end - 4] == 0 && query[end - 3] == 1;
      uint8_t answer[600];
      std::copy(query, query + end, answer);
      answer[2] = 0x81;  // a response, recursion desired
      answer[3] = 0x80;  // recursion available, no error
      answer[4] = 0, answer[5] = 1;  // one question
      answer[6] = 0, answer[7] = a ? 1 : 0;
      for (int i = 8; i < 12; ++i) answer[i] = 0;
      size_t length = end;
      if (a) {
        const uint8_t record[] = {0xc0, 12,        // the question's name
                                  0,    1,   0, 1,  // A, IN
                                  0,    0,   0, 1,  // TTL 1 s
                                  0,    4,   127, 0, 0, 1};
        std::copy(record, record + sizeof(record), answer + length);
        length += sizeof(record);
      }
      sendto(fd_, answer, length, 0, reinterpret_cast<sockaddr*>(&from), from_length);
      absl::MutexLock lock(&mu_);
      ++answered_;
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int first_port_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> ports_ ABSL_GUARDED_BY(mu_);
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
};

// A lookup whose queries are lost gives up after kDnsQueryTimeout and a
// fresh one (a new socket) reaches the peer: with gRPC's 120 s default the
// channel would wait on the deaf socket for two minutes.
TEST(SetQuickReconnect, ALookupThatGetsNoAnswerIsStartedAgainOnAFreshSocket) {
  grpc::CallbackGenericService service;  // any service: the peer only has to accept
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&service);
  int peer_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &peer_port);
  std::unique_ptr<grpc::Server> peer = builder.BuildAndStart();
  ASSERT_NE(peer, nullptr);
  DeafToFirstSocketDns dns;
  ASSERT_NE(dns.port(), 0);

  grpc::ChannelArguments args;
  SetQuickReconnect(args);
  const std::string target =
      "dns://127.0.0.1:" + std::to_string(dns.port()) + "/peer.shardtrain.test:" +
      std::to_string(peer_port);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const absl::Time start = absl::Now();
  const bool connected =
      channel->WaitForConnected(absl::ToChronoTime(start + kDnsQueryTimeout + absl::Seconds(8)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(connected) << "not connected after " << took << "; " << dns.sockets_seen()
                         << " socket(s) asked, " << dns.answered() << " answer(s)";
  EXPECT_GE(dns.sockets_seen(), 2);
  EXPECT_GE(took, kDnsQueryTimeout - absl::Milliseconds(100)) << "the first socket was answered";
  peer->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace shardtrain::common
