#include "server/bad_body_interceptor.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/interceptor.h>
#include <grpcpp/support/status.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace shardtrain::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class BadBodyInterceptor : public grpc::experimental::Interceptor {
 public:
  // `method` lives as long as the server (gRPC's registered method name).
  explicit BadBodyInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      bad_body_ = true;
    }
    if (bad_body_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !methods->GetSendStatus().ok()) {
      // Only where the first message is the whole request: in a client
      // stream a null message also means the client closed its side.
      const std::string type = RequestTypeOf(method_);
      if (!type.empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request body is not a valid ", type)));
      }
    }
    methods->Proceed();
  }

 private:
  const char* const method_;
  bool bad_body_ = false;
};

}  // namespace

std::string RequestTypeOf(const char* method) {
  if (method == nullptr) return "";
  // "/pkg.Service/Method" -> "pkg.Service.Method"
  std::string name = method;
  if (!name.empty() && name[0] == '/') name.erase(0, 1);
  absl::StrReplaceAll({{"/", "."}}, &name);
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
  if (descriptor == nullptr || descriptor->client_streaming()) return "";
  return descriptor->input_type()->full_name();
}

grpc::experimental::Interceptor* BadBodyInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new BadBodyInterceptor(info->method());
}

}  // namespace shardtrain::server
