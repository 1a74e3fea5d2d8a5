#include "sparse/step_gradients.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_format.h"

namespace shardtrain::sparse {

StepGradients::StepGradients(int32_t dim, int num_workers)
    : dim_(dim), num_workers_(num_workers), arrived_(static_cast<size_t>(num_workers)) {}

void StepGradients::Add(int worker, absl::Span<const uint64_t> ids, const float* grads) {
  const size_t d = static_cast<size_t>(dim_);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = index_.try_emplace(ids[i], static_cast<uint32_t>(ids_.size()));
    const float* g = grads + i * d;
    if (fresh) {
      ids_.push_back(ids[i]);
      sums_.insert(sums_.end(), g, g + d);
      continue;
    }
    float* sum = &sums_[static_cast<size_t>(it->second) * d];
    for (size_t j = 0; j < d; ++j) sum[j] += g[j];
  }
  arrived_[static_cast<size_t>(worker)] = true;
  ++arrivals_;
}

void StepGradients::TakeMean(std::vector<uint64_t>* ids, std::vector<float>* grads) {
  const size_t d = static_cast<size_t>(dim_);
  std::vector<uint32_t> order(ids_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [this](uint32_t a, uint32_t b) { return ids_[a] < ids_[b]; });
  const float scale = 1.0f / static_cast<float>(num_workers_);
  ids->resize(order.size());
  grads->resize(order.size() * d);
  for (size_t k = 0; k < order.size(); ++k) {
    (*ids)[k] = ids_[order[k]];
    const float* sum = &sums_[static_cast<size_t>(order[k]) * d];
    float* out = grads->data() + k * d;
    for (size_t j = 0; j < d; ++j) out[j] = sum[j] * scale;
  }
  Clear();
}

void StepGradients::Clear() {
  index_.clear();
  ids_.clear();
  sums_.clear();
  std::fill(arrived_.begin(), arrived_.end(), false);
  arrivals_ = 0;
}

void StepGradients::Export(std::string* ids_and_sums, std::vector<uint32_t>* arrived) const {
  const size_t id_bytes = ids_.size() * sizeof(uint64_t);
  const size_t sum_bytes = sums_.size() * sizeof(float);
  ids_and_sums->resize(id_bytes + sum_bytes);
  if (id_bytes > 0) std::memcpy(ids_and_sums->data(), ids_.data(), id_bytes);
  if (sum_bytes > 0) std::memcpy(ids_and_sums->data() + id_bytes, sums_.data(), sum_bytes);
  arrived->clear();
  for (int w = 0; w < num_workers_; ++w) {
    if (arrived_[static_cast<size_t>(w)]) arrived->push_back(static_cast<uint32_t>(w));
  }
}

absl::Status StepGradients::Import(absl::string_view ids_and_sums,
                                   absl::Span<const uint32_t> arrived) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t entry = sizeof(uint64_t) + d * sizeof(float);
  if (ids_and_sums.size() % entry != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a sync step of %d bytes is not whole entries of an id and %d sums",
        ids_and_sums.size(), dim_));
  }
  const size_t n = ids_and_sums.size() / entry;
  std::vector<uint64_t> ids(n);
  std::vector<float> sums(n * d);
  if (n > 0) {
    std::memcpy(ids.data(), ids_and_sums.data(), n * sizeof(uint64_t));
    std::memcpy(sums.data(), ids_and_sums.data() + n * sizeof(uint64_t),
                sums.size() * sizeof(float));
  }
  for (float s : sums) {
    if (!std::isfinite(s)) return absl::InvalidArgumentError("a sync step holds a NaN or Inf sum");
  }
  absl::flat_hash_map<uint64_t, uint32_t> index;
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!index.try_emplace(ids[i], static_cast<uint32_t>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a sync step names id %d twice", ids[i]));
    }
  }
  std::vector<bool> in(static_cast<size_t>(num_workers_));
  for (uint32_t w : arrived) {
    if (w >= static_cast<uint32_t>(num_workers_) || in[w]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a sync step names worker %d, not one of %d workers once", w, num_workers_));
    }
    in[w] = true;
  }
  index_ = std::move(index);
  ids_ = std::move(ids);
  sums_ = std::move(sums);
  arrived_ = std::move(in);
  arrivals_ = static_cast<int>(arrived.size());
  return absl::OkStatus();
}

}  // namespace shardtrain::sparse
