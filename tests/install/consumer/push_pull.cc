// Registers a 4-element tensor (all ones) on the shard at argv[1], pushes
// the gradient {1, 2, 3, 4}, pulls, and checks the shard's SGD step with
// lr 0.5: {0.5, 0, -0.5, -1}. Exit status 0 when it matches.
//
//   push_pull 127.0.0.1:PORT    (ps-server --optimizer=sgd --lr=0.5 --num_workers=1)
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/ps_client.h"

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT\n", argv[0]);
    return 2;
  }
  shardtrain::client::PsClientOptions options;
  options.servers = {argv[1]};
  options.num_workers = 1;
  options.reconnect_timeout = absl::Seconds(20);
  auto client = shardtrain::client::PsClient::Create(options, /*rpc_metrics=*/nullptr);
  if (!client.ok()) return Fail("Create", client.status());

  shardtrain::TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(4);
  spec.set_dtype(shardtrain::DTYPE_F32);
  spec.mutable_init()->set_kind(shardtrain::Initializer::KIND_CONSTANT);
  spec.mutable_init()->set_scale(1.0f);
  if (absl::Status s = (*client)->Register({spec}); !s.ok()) return Fail("Register", s);

  const std::vector<float> grad = {1, 2, 3, 4};
  std::vector<float> params(4, -99.0f);
  const absl::Span<const float> grads[] = {grad};
  const absl::Span<float> outs[] = {absl::MakeSpan(params)};
  shardtrain::client::PushStats push_stats;
  shardtrain::client::PullStats pull_stats;
  if (absl::Status s = (*client)->Push(1, grads, &push_stats); !s.ok()) return Fail("Push", s);
  if (absl::Status s = (*client)->Pull(1, 1, outs, &pull_stats); !s.ok()) return Fail("Pull", s);

  const float want[] = {0.5f, 0.0f, -0.5f, -1.0f};
  for (int i = 0; i < 4; ++i) {
    if (std::fabs(params[i] - want[i]) > 1e-6f) {
      std::fprintf(stderr, "params[%d] = %g, want %g\n", i, params[i], want[i]);
      return 1;
    }
  }
  std::printf("push_pull OK: pulled %g %g %g %g (version %lld)\n", params[0], params[1],
              params[2], params[3], static_cast<long long>(pull_stats.min_version));
  return 0;
}
