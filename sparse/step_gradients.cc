#include "sparse/step_gradients.h"

#include <algorithm>
#include <cstring>
#include <numeric>

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

}  // namespace shardtrain::sparse
