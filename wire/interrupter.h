// Interrupter: a flag that a thread blocked in poll() sees at once. It
// owns an eventfd that becomes readable when Trigger is called; a wait
// polls it beside its socket (FrameSocket::Connect does) and gives up
// when it fires. Used to cut a connect short: the call it was for was
// cancelled, the shard's port moved, or the channel is closing.
//
//   auto interrupter = std::make_shared<wire::Interrupter>();
//   ... another thread: interrupter->Trigger();
//   FrameSocket::Connect(host, port, timeout, interrupter.get());  // CANCELLED
//
// Triggering is once and for good. When no eventfd can be had (the process
// is out of file descriptors), fd() is -1 and waits cannot see a Trigger:
// they end at their own timeouts, as they would without an Interrupter.
// Thread-safe.
#ifndef SHARDTRAIN_WIRE_INTERRUPTER_H_
#define SHARDTRAIN_WIRE_INTERRUPTER_H_

#include <atomic>

namespace shardtrain::wire {

class Interrupter {
 public:
  Interrupter();
  ~Interrupter();  // closes the eventfd
  Interrupter(const Interrupter&) = delete;
  Interrupter& operator=(const Interrupter&) = delete;

  // Makes fd() readable, now and from now on. Idempotent.
  void Trigger();
  bool triggered() const { return triggered_.load(); }
  // Readable once triggered; -1 when none could be created.
  int fd() const { return fd_; }

 private:
  const int fd_;
  std::atomic<bool> triggered_{false};
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_INTERRUPTER_H_
