#include "common/metrics_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace shardtrain::common {


MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                               std::shared_ptr<prometheus::Registry> registry,
                               int port)
    : exposer_(std::move(exposer)), registry_(std::move(registry)), port_(port) {}

namespace {

// Opens and drops a connection to 127.0.0.1:port without waiting for it.
void Knock(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
  close(fd);
}

}  // namespace

// civetweb's listening thread looks at its stop flag only between polls of
// up to 2 s, so stopping an idle exposer took 1-2 s at every exit of
// ps-server and ps-worker (and of every test that stops one). While the
// exposer stops, a connection every 20 ms wakes that poll. An exposer bound
// to one address other than loopback is not reached and stops as before.
MetricsExposer::~MetricsExposer() {
  if (exposer_ == nullptr) return;
  absl::Notification stopped;
  std::thread stopper([this, &stopped] {
    exposer_.reset();
    stopped.Notify();
  });
  while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(20))) Knock(port_);
  stopper.join();
}

void MetricsExposer::AddCollectable(std::shared_ptr<prometheus::Collectable> collectable) {
  if (exposer_ != nullptr) exposer_->RegisterCollectable(collectable);
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Create(
    const std::string& address) {
  auto registry = std::make_shared<prometheus::Registry>();
  if (address.empty()) {
    return std::unique_ptr<MetricsExposer>(
        new MetricsExposer(nullptr, std::move(registry), 0));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One server thread: scrapes are rare and the machine may be small.
    exposer = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics server on ", address, " bound no port"));
  }
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsExposer>(
      new MetricsExposer(std::move(exposer), std::move(registry), ports[0]));
}

}  // namespace shardtrain::common
