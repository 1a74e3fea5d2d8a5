#include "worker/model/model_spec.h"

#include <cstddef>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardtrain::worker {
namespace {

constexpr absl::string_view kMlpPrefix = "mlp:";

absl::Status BadSpec(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad model spec \"", text, "\": ", why,
                   " (expected e.g. \"mlp:784-256-10\")"));
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpec::Parse(absl::string_view text) {
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, kMlpPrefix)) {
    return BadSpec(text, "must start with \"mlp:\"");
  }
  ModelSpec spec;
  for (absl::string_view part : absl::StrSplit(rest, '-')) {
    if (part.empty()) return BadSpec(text, "empty layer size");
    if (part.size() > 1 && part[0] == '0') {
      return BadSpec(
          text, absl::StrCat("layer size \"", part, "\" has a leading zero"));
    }
    // Digits only, no leading zeros: SimpleAtoi would also take signs and
    // spaces, and each would give one model several spellings.
    int64_t value = 0;
    for (char c : part) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        return BadSpec(text, absl::StrCat("layer size \"", part,
                                          "\" is not a decimal number"));
      }
      value = value * 10 + (c - '0');
      if (value > kMaxLayerSize) {
        return BadSpec(text, absl::StrCat("layer size \"", part, "\" exceeds ",
                                          kMaxLayerSize));
      }
    }
    if (value < 1) {
      return BadSpec(
          text, absl::StrCat("layer size \"", part, "\" must be at least 1"));
    }
    spec.layer_sizes.push_back(static_cast<int>(value));
  }
  if (spec.layer_sizes.size() < 2) {
    return BadSpec(text, "needs at least an input and an output size");
  }
  return spec;
}

absl::Status ModelSpec::Validate() const {
  if (layer_sizes.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec has ", layer_sizes.size(),
                     " layer sizes; needs at least 2 (input and output)"));
  }
  for (size_t i = 0; i < layer_sizes.size(); ++i) {
    if (layer_sizes[i] < 1 || layer_sizes[i] > kMaxLayerSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("model spec layer size ", i, " is ", layer_sizes[i],
                       "; must be in [1, ", kMaxLayerSize, "]"));
    }
  }
  return absl::OkStatus();
}

std::string ModelSpec::ToString() const {
  return absl::StrCat(kMlpPrefix, absl::StrJoin(layer_sizes, "-"));
}

}  // namespace shardtrain::worker
