// FrameSocket: one end of a framed TCP connection, the data path's way
// around HTTP/2. A frame is a FrameHeader (wire/frame_header.h), an optional
// status message and a body written with one sendmsg from the caller's
// slices (no copy in user space) and read into one slice of its own (a
// BufferPool block from 32 MiB up, wire/buffer_pool.h), which the caller
// gets as a grpc::ByteBuffer without a copy, so that the zero-copy views of
// wire/ parse it as they parse what gRPC received.
// Whoever reads and whoever writes run the call themselves: no thread
// hands a frame to another.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<FrameSocket> socket,
//                    FrameSocket::Connect("127.0.0.1", port, absl::Seconds(5)));
//   FrameHeader request;
//   request.method = 1;
//   request.call_id = 7;
//   RETURN_IF_ERROR(socket->Write(request, "", &body, deadline));
//   FrameHeader reply;
//   std::string message;
//   grpc::ByteBuffer answer;
//   RETURN_IF_ERROR(socket->Read(max_body, max_message, deadline, &reply, &message, &answer));
//
// StartTls makes it a TLS connection (wire/tls_context.h) before its
// first frame; frames then travel encrypted, the same way. OpenSSL copies
// what it encrypts and decrypts, so a TLS frame costs a copy each way that
// the plaintext one does not.
//
// Errors: DEADLINE_EXCEEDED past the deadline, UNAVAILABLE when the
// connection fails or the peer closes within a frame, OUT_OF_RANGE when the
// peer closed it between frames (a clean end), and FrameHeader::Decode's
// for a bad header. After any of them the connection is unusable (a frame
// may be half written or read): close it.
//
// One thread may read while another writes (with TLS, their OpenSSL calls
// take turns on one lock, never held while they wait for the socket);
// Shutdown may be called from any thread. Otherwise thread-compatible.
#ifndef SHARDTRAIN_WIRE_FRAME_SOCKET_H_
#define SHARDTRAIN_WIRE_FRAME_SOCKET_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/frame_header.h"
#include "wire/interrupter.h"
#include "wire/tls_context.h"

struct ssl_st;  // OpenSSL's SSL

namespace shardtrain::wire {

class FrameSocket {
 public:
  // Connects to `host` (a name or a numeric address) and `port`, trying
  // each address it resolves to, within `timeout`. UNAVAILABLE when none
  // accepts, DEADLINE_EXCEEDED when the time runs out, CANCELLED as soon as
  // `interrupter` (optional) is triggered while a connect is pending (the
  // name lookup itself is not interrupted).
  static absl::StatusOr<std::unique_ptr<FrameSocket>> Connect(
      const std::string& host, int port, absl::Duration timeout,
      const Interrupter* interrupter = nullptr);

  // Takes `fd`, a connected stream socket (an accepted connection, one end
  // of a socketpair): made non-blocking; TCP_NODELAY where it is TCP.
  explicit FrameSocket(int fd);
  ~FrameSocket();  // closes it
  FrameSocket(const FrameSocket&) = delete;
  FrameSocket& operator=(const FrameSocket&) = delete;

  // Runs the TLS handshake of `tls`'s side (the client's verifies the
  // shard's certificate for tls.server_name(), or else `peer_host`, the
  // name or address it was reached by), until `deadline`. UNAVAILABLE when
  // it fails (the message says why: a certificate not trusted, a name it
  // does not carry, no client certificate), DEADLINE_EXCEEDED, CANCELLED as
  // soon as `interrupter` (optional) is triggered. Once, before any frame.
  absl::Status StartTls(const TlsContext& tls, const std::string& peer_host, absl::Time deadline,
                        const Interrupter* interrupter = nullptr);
  bool tls() const { return ssl_ != nullptr; }

  // Writes one frame: `header` with its message_bytes and body_bytes set
  // from `message` and `body` (may be null: no body).
  absl::Status Write(FrameHeader header, absl::string_view message,
                     const grpc::ByteBuffer* body, absl::Time deadline);

  // Reads one frame into `*header`, `*message` and `*body` (one slice).
  // The limits are FrameHeader::Decode's.
  absl::Status Read(uint64_t max_body_bytes, uint32_t max_message_bytes, absl::Time deadline,
                    FrameHeader* header, std::string* message, grpc::ByteBuffer* body);

  // Waits until something can be read (a frame's first bytes, or the
  // peer's close), until `deadline`: OK, or DEADLINE_EXCEEDED with the
  // connection still usable.
  absl::Status WaitReadable(absl::Time deadline);

  // Ends the connection both ways; a Read or Write blocked in another
  // thread returns at once. Thread-safe.
  void Shutdown();

 private:
  // Reads exactly `bytes` bytes into `out`. `started`: whether part of
  // this frame has been read already (a close is then UNAVAILABLE).
  absl::Status ReadExactly(char* out, size_t bytes, absl::Time deadline, bool started);

  // Runs `op` (an OpenSSL call on ssl_ that returns 1 when it is done)
  // under ssl_mu_ until it is done, waiting for the socket outside the
  // lock. *closed (optional): set when the peer closed the connection.
  template <typename Op>
  absl::Status RunTls(const char* what, Op op, absl::Time deadline, int interrupt = -1,
                      bool* closed = nullptr);
  // Writes `bytes` bytes in TLS records (into the write buffer).
  absl::Status WriteTls(const char* data, size_t bytes, absl::Time deadline);
  // Writes out what the write buffer holds.
  absl::Status FlushTls(absl::Time deadline);

  const int fd_;
  // Set once by StartTls, before the socket is shared.
  ssl_st* ssl_ = nullptr;
  // SSL objects are not safe for concurrent calls: the reader's and the
  // writer's take turns.
  absl::Mutex ssl_mu_;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_FRAME_SOCKET_H_
