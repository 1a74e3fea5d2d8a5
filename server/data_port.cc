#include "server/data_port.h"

#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace shardtrain::server {

absl::StatusOr<std::unique_ptr<DataPort>> DataPort::Start(const DataPortOptions& options,
                                                         ParameterServerService* service,
                                                         prometheus::Registry& registry) {
  absl::StatusOr<std::unique_ptr<wire::FrameListener>> listener =
      wire::FrameListener::Listen(options.listen_address);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("--data_listen: ", listener.status().message()));
  }
  std::unique_ptr<DataPort> port(
      new DataPort(options, service, *std::move(listener), registry));
  port->acceptor_ = std::thread([p = port.get()] { p->AcceptLoop(); });
  return port;
}

DataPort::DataPort(const DataPortOptions& options, ParameterServerService* service,
                   std::unique_ptr<wire::FrameListener> listener,
                   prometheus::Registry& registry)
    : options_(options),
      service_(service),
      listener_(std::move(listener)),
      connections_gauge_(prometheus::BuildGauge()
                             .Name("shardtrain_data_connections")
                             .Help("Connections open on the shard's data port")
                             .Register(registry)
                             .Add({})),
      refused_(prometheus::BuildCounter()
                   .Name("shardtrain_data_connections_refused_total")
                   .Help("Data-port connections closed at once: --max_data_connections open")
                   .Register(registry)
                   .Add({})) {}

DataPort::~DataPort() { Shutdown(); }

void DataPort::AcceptLoop() {
  while (true) {
    absl::StatusOr<std::unique_ptr<wire::FrameSocket>> socket = listener_->Accept();
    if (!socket.ok()) {
      if (!absl::IsCancelled(socket.status())) {
        LOG(ERROR) << "data port stops accepting: " << socket.status();
      }
      return;
    }
    Reap();
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    if (open_ >= options_.max_connections) {
      refused_.Increment();
      LOG_EVERY_N(WARNING, 100)
          << "data port: " << open_ << " connections open (--max_data_connections); a "
          << "new one is closed, and its worker uses gRPC";
      continue;  // `socket` closes it
    }
    ++open_;
    connections_gauge_.Set(open_);
    served_.emplace_back();
    Served& served = served_.back();
    served.connection = std::make_unique<DataConnection>(
        *std::move(socket), service_, options_.limits, options_.tls, options_.auth_failures);
    served.thread = std::thread([this, &served] {
      served.connection->Serve();
      absl::MutexLock lock(&mu_);
      served.ended = true;
      --open_;
      connections_gauge_.Set(open_);
    });
  }
}

void DataPort::Reap() {
  std::list<Served> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = served_.begin(); it != served_.end();) {
      auto next = std::next(it);
      if (it->ended) ended.splice(ended.end(), served_, it);
      it = next;
    }
  }
  for (Served& served : ended) served.thread.join();
}

void DataPort::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  listener_->Shutdown();
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Served> all;
  {
    absl::MutexLock lock(&mu_);
    for (Served& served : served_) served.connection->Shutdown();
    all.splice(all.end(), served_);
  }
  for (Served& served : all) served.thread.join();
}

}  // namespace shardtrain::server
