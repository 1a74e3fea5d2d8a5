// HangingPort: a port on 127.0.0.1 whose connects hang, for tests of what
// waits on a connect. It is a listener with a backlog of 0 whose one queue
// slot is taken by a connection never accepted, so the kernel drops the
// SYNs that come after it. Closes its sockets when it goes.
//
//   HangingPort hanging;
//   FrameSocket::Connect("127.0.0.1", hanging.port(), absl::Seconds(20));  // hangs
//   hanging.Close();  // from now on connects are refused
#ifndef SHARDTRAIN_WIRE_TESTING_HANGING_PORT_H_
#define SHARDTRAIN_WIRE_TESTING_HANGING_PORT_H_

namespace shardtrain::wire {

class HangingPort {
 public:
  HangingPort();  // CHECK-fails when the sockets cannot be set up
  ~HangingPort() { Close(); }
  HangingPort(const HangingPort&) = delete;
  HangingPort& operator=(const HangingPort&) = delete;

  // The port refuses connects from now on (the SYN's next retry is reset).
  void Close();
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int queued_ = -1;
  int port_ = 0;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_TESTING_HANGING_PORT_H_
