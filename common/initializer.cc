#include "common/initializer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_format.h"
#include "common/partition.h"

namespace shardtrain::common {
namespace {

// Tensors above this many elements (16 GiB of f32) are refused outright.
constexpr int64_t kMaxTensorElements = int64_t{1} << 32;
constexpr size_t kMaxNameLength = 256;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float ValueAt(const std::string& values, int64_t i) {
  float v;
  std::memcpy(&v, values.data() + i * sizeof(float), sizeof(float));
  return v;
}

// The KIND_VALUES part of ValidateTensorSpec.
absl::Status ValidateValues(const TensorSpec& spec, int64_t elements) {
  const std::string& values = spec.values();
  if (values.empty()) return absl::OkStatus();
  if (spec.init().kind() != Initializer::KIND_VALUES) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: values are only sent with the KIND_VALUES initializer", spec.name()));
  }
  if (static_cast<int64_t>(values.size()) != elements * int64_t{sizeof(float)}) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: %d bytes of initial values for %d f32 elements (%d bytes expected)",
        spec.name(), values.size(), elements, elements * int64_t{sizeof(float)}));
  }
  for (int64_t i = 0; i < elements; ++i) {
    const float v = ValueAt(values, i);
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s: initial value %d is %f; every value must be finite", spec.name(),
          i, v));
    }
  }
  return absl::OkStatus();
}

// Uniform in (0, 1), never 0 so log() below is finite.
double Uniform01(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

absl::Status ValidateTensorSpec(const TensorSpec& spec) {
  if (spec.name().empty() || spec.name().size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor name must have 1 to %d bytes, got %d", kMaxNameLength,
        spec.name().size()));
  }
  if (spec.shape().empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor %s has no shape", spec.name()));
  }
  int64_t elements = 1;
  for (int64_t dim : spec.shape()) {
    if (dim <= 0 || dim > kMaxTensorElements / elements) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s: dimension %d is not positive or the tensor exceeds %d "
          "elements",
          spec.name(), dim, kMaxTensorElements));
    }
    elements *= dim;
  }
  if (spec.dtype() != DTYPE_F32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: stored dtype must be f32, got %d", spec.name(), spec.dtype()));
  }
  const Initializer& init = spec.init();
  if (!Initializer::Kind_IsValid(init.kind())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: unknown initializer kind %d", spec.name(), init.kind()));
  }
  if (!std::isfinite(init.scale()) ||
      ((init.kind() == Initializer::KIND_UNIFORM ||
        init.kind() == Initializer::KIND_NORMAL) &&
       init.scale() < 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: initializer scale %f is invalid", spec.name(), init.scale()));
  }
  return ValidateValues(spec, elements);
}

bool SameTensorSpec(const TensorSpec& a, const TensorSpec& b) {
  google::protobuf::util::MessageDifferencer differencer;
  differencer.IgnoreField(TensorSpec::descriptor()->FindFieldByNumber(
      TensorSpec::kValuesFieldNumber));
  return differencer.Compare(a, b);
}

TensorSpec WithoutValues(const TensorSpec& spec) {
  // Field by field (a new TensorSpec field must be added here): copying the
  // whole spec would copy the values too.
  TensorSpec stripped;
  stripped.set_name(spec.name());
  *stripped.mutable_shape() = spec.shape();
  stripped.set_dtype(spec.dtype());
  if (spec.has_init()) *stripped.mutable_init() = spec.init();
  return stripped;
}

int64_t NumElements(const TensorSpec& spec) {
  int64_t elements = 1;
  for (int64_t dim : spec.shape()) elements *= dim;
  return elements;
}

void FillInitialValues(const TensorSpec& spec, int64_t offset,
                       absl::Span<float> out) {
  const Initializer& init = spec.init();
  const int64_t fan_in = spec.shape(0);
  const int64_t fan_out = spec.shape_size() > 1 ? spec.shape(1) : 1;
  double bound = init.scale();
  switch (init.kind()) {
    case Initializer::KIND_ZEROS:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case Initializer::KIND_CONSTANT:
      std::fill(out.begin(), out.end(), init.scale());
      return;
    case Initializer::KIND_VALUES:
      if (spec.values().empty()) {
        std::fill(out.begin(), out.end(), 0.0f);
      } else {
        std::memcpy(out.data(), spec.values().data() + offset * sizeof(float),
                    out.size() * sizeof(float));
      }
      return;
    case Initializer::KIND_GLOROT_UNIFORM:
      bound = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
      break;
    case Initializer::KIND_HE_UNIFORM:
      bound = std::sqrt(6.0 / static_cast<double>(fan_in));
      break;
    default:
      break;
  }
  const uint64_t stream = SplitMix64(init.seed() ^ Fnv1a(spec.name()));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t counter = static_cast<uint64_t>(offset) + i;
    const uint64_t a = SplitMix64(stream ^ (2 * counter));
    if (init.kind() == Initializer::KIND_NORMAL) {
      const uint64_t b = SplitMix64(stream ^ (2 * counter + 1));
      const double radius = std::sqrt(-2.0 * std::log(Uniform01(a)));
      out[i] = static_cast<float>(init.scale() * radius *
                                  std::cos(2.0 * M_PI * Uniform01(b)));
    } else {
      out[i] = static_cast<float>(bound * (2.0 * Uniform01(a) - 1.0));
    }
  }
}

}  // namespace shardtrain::common
