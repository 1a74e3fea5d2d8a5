// ViewOf: views of stock protobuf messages (wire/message_views.h).
#include "wire/message_views.h"

namespace shardtrain::wire {
namespace {

PayloadView PayloadOf(const Payload& payload) {
  PayloadView view;
  view.dtype = payload.dtype();
  view.encoding = payload.encoding();
  view.data = ReceivedBytes(payload.data());
  view.indices = ReceivedBytes(payload.indices());
  return view;
}

KeyView KeyOf(const PartitionKey& key) { return KeyView{key.tensor(), key.partition()}; }

}  // namespace

PushView ViewOf(const PushRequest& message) {
  PushView view;
  view.worker = message.worker();
  view.clock = message.clock();
  view.worker_incarnation = message.worker_incarnation();
  view.sequence = message.sequence();
  view.shard_incarnation = message.shard_incarnation();
  view.chain_epoch = message.chain_epoch();
  view.clock_parts = message.clock_parts();
  view.replicated.assign(message.replicated().begin(), message.replicated().end());
  view.parts.reserve(message.parts_size());
  for (const GradientPart& part : message.parts()) {
    GradientPartView& out = view.parts.emplace_back();
    out.key = KeyOf(part.key());
    out.version = part.version();
    out.has_grad = part.has_grad();
    if (part.has_grad()) out.grad = PayloadOf(part.grad());
  }
  return view;
}

PullResponseView ViewOf(const PullResponse& message) {
  PullResponseView view;
  view.wait_seconds = message.wait_seconds();
  view.incarnation = message.incarnation();
  view.parts.reserve(message.parts_size());
  for (const ParameterPart& part : message.parts()) {
    ParameterPartView& out = view.parts.emplace_back();
    out.key = KeyOf(part.key());
    out.version = part.version();
    out.has_value = part.has_value();
    if (part.has_value()) out.value = PayloadOf(part.value());
  }
  return view;
}

}  // namespace shardtrain::wire
