#include "wire/testing/view_diff.h"

#include <cstdint>
#include <cstring>

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::wire {
namespace {

using google::protobuf::util::MessageDifferencer;

template <typename T>
std::string DiffValue(absl::string_view name, const T& a, const T& b) {
  if (a == b) return "";
  return absl::StrCat(name, ": ", a, " vs ", b);
}

std::string DiffBytes(absl::string_view name, const ReceivedBytes& a, const ReceivedBytes& b) {
  const std::string x = a.ToString(), y = b.ToString();
  if (x == y) return "";
  return absl::StrCat(name, ": ", x.size(), " bytes \"", absl::CEscape(x.substr(0, 32)),
                      "\" vs ", y.size(), " bytes \"", absl::CEscape(y.substr(0, 32)), "\"");
}

std::string DiffPayload(absl::string_view name, const PayloadView& a, const PayloadView& b) {
  std::string diff = DiffValue(absl::StrCat(name, ".dtype"), a.dtype, b.dtype);
  if (diff.empty()) diff = DiffValue(absl::StrCat(name, ".encoding"), a.encoding, b.encoding);
  if (diff.empty()) diff = DiffBytes(absl::StrCat(name, ".data"), a.data, b.data);
  if (diff.empty()) diff = DiffBytes(absl::StrCat(name, ".indices"), a.indices, b.indices);
  return diff;
}

std::string DiffKey(absl::string_view name, const KeyView& a, const KeyView& b) {
  if (a.tensor != b.tensor) {
    return absl::StrCat(name, ".tensor: \"", absl::CEscape(a.tensor), "\" vs \"",
                        absl::CEscape(b.tensor), "\"");
  }
  return DiffValue(absl::StrCat(name, ".partition"), a.partition, b.partition);
}

template <typename Part>
std::string DiffParts(const std::vector<Part>& a, const std::vector<Part>& b,
                      bool Part::*has_payload, PayloadView Part::*payload,
                      absl::string_view payload_name) {
  if (a.size() != b.size()) return absl::StrCat("parts: ", a.size(), " vs ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string name = absl::StrCat("parts[", i, "]");
    std::string diff = DiffKey(absl::StrCat(name, ".key"), a[i].key, b[i].key);
    if (diff.empty()) diff = DiffValue(absl::StrCat(name, ".version"), a[i].version, b[i].version);
    if (diff.empty()) {
      diff = DiffValue(absl::StrCat(name, ".has_", payload_name), a[i].*has_payload,
                       b[i].*has_payload);
    }
    if (diff.empty() && a[i].*has_payload) {
      diff = DiffPayload(absl::StrCat(name, ".", payload_name), a[i].*payload, b[i].*payload);
    }
    if (!diff.empty()) return diff;
  }
  return "";
}

std::string DiffMessages(absl::string_view name, const google::protobuf::Message& a,
                         const google::protobuf::Message& b) {
  std::string report;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(a, b)) return "";
  return absl::StrCat(name, ": ", report);
}

}  // namespace

std::string DiffViews(const PushView& a, const PushView& b) {
  std::string diff = DiffValue("worker", a.worker, b.worker);
  if (diff.empty()) diff = DiffValue("clock", a.clock, b.clock);
  if (diff.empty()) {
    diff = DiffValue("worker_incarnation", a.worker_incarnation, b.worker_incarnation);
  }
  if (diff.empty()) diff = DiffValue("sequence", a.sequence, b.sequence);
  if (diff.empty()) {
    diff = DiffValue("shard_incarnation", a.shard_incarnation, b.shard_incarnation);
  }
  if (diff.empty()) diff = DiffValue("clock_parts", a.clock_parts, b.clock_parts);
  if (diff.empty()) {
    diff = DiffParts(a.parts, b.parts, &GradientPartView::has_grad, &GradientPartView::grad,
                     "grad");
  }
  return diff;
}

std::string DiffViews(const PullResponseView& a, const PullResponseView& b) {
  uint64_t bits_a, bits_b;
  std::memcpy(&bits_a, &a.wait_seconds, sizeof(bits_a));
  std::memcpy(&bits_b, &b.wait_seconds, sizeof(bits_b));
  std::string diff;
  if (bits_a != bits_b) diff = absl::StrCat("wait_seconds: ", a.wait_seconds, " vs ", b.wait_seconds);
  if (diff.empty()) diff = DiffValue("incarnation", a.incarnation, b.incarnation);
  if (diff.empty()) {
    diff = DiffParts(a.parts, b.parts, &ParameterPartView::has_value,
                     &ParameterPartView::value, "value");
  }
  return diff;
}

std::string DiffViews(const PushPullView& a, const PushPullView& b) {
  std::string diff = DiffViews(a.push, b.push);
  if (!diff.empty()) return absl::StrCat("push.", diff);
  return DiffMessages("pull", a.pull, b.pull);
}

std::string DiffViews(const PushPullResponseView& a, const PushPullResponseView& b) {
  std::string diff = DiffMessages("push", a.push, b.push);
  if (!diff.empty()) return diff;
  diff = DiffViews(a.pull, b.pull);
  return diff.empty() ? "" : absl::StrCat("pull.", diff);
}

PushPullView ViewOf(const PushPullRequest& message) {
  PushPullView view;
  view.push = ViewOf(message.push());
  view.pull = message.pull();
  return view;
}

PushPullResponseView ViewOf(const PushPullResponse& message) {
  PushPullResponseView view;
  view.push = message.push();
  view.pull = ViewOf(message.pull());
  return view;
}

}  // namespace shardtrain::wire
