// sparse_table_bench: a shard's in-process cost of a sparse table's two
// operations, per core, at the size recommendation tables run at.
//
// A table of --rows rows (dim --dim, f32, row-wise Adagrad) is filled, then
// batches of --batch ids drawn from a Zipf(--alpha) over those rows (rank r
// is id Mix64(r), so hot ids are scattered over the key space) go through:
//  - lookup: training find-or-create of every id of the batch and a copy of
//            its row into the output (EmbeddingTable::LookupForTraining);
//  - apply:  a row-wise Adagrad update of each of the batch's unique ids
//            (EmbeddingTable::Apply).
// Baseline in the same run, doing the same work on the same ids: a plain
// absl::flat_hash_map<uint64_t, uint32_t> from id to a row of a flat arena
// (value and accumulator side by side), probed one id at a time.
// Rounds alternate table and baseline; figures are medians over --rounds of
// rows per second on one thread, and the medians of per-round ratios.
// Memory: RSS growth while each structure takes its --rows rows, per row
// (the table sized by its capacity, as a configured table is).
//
//   sparse_table_bench --out=bench/results/sparse_table_cpu.txt
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/status_macros.h"
#include "sparse/embedding_table.h"
#include "sparse/id_hash.h"

ABSL_FLAG(int64_t, rows, 10'000'000, "Rows in the table");
ABSL_FLAG(int, dim, 16, "Embedding dim");
ABSL_FLAG(int, batch, 65536, "Ids per batch");
ABSL_FLAG(int, batches, 16, "Batches per round");
ABSL_FLAG(int, rounds, 5, "Rounds (medians reported)");
ABSL_FLAG(double, alpha, 1.1, "Zipf exponent of the ids");
ABSL_FLAG(std::string, storage, "f32", "How the table stores its rows' values: f32 or bf16");
ABSL_FLAG(std::string, out, "", "Also write the table to this file");

namespace shardtrain {
namespace {

using Clock = std::chrono::steady_clock;
using sparse::Mix64;

int64_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Ranks 0..n-1 drawn with P(r) proportional to (r + 1)^-alpha, by inverse CDF.
std::vector<uint64_t> ZipfIds(int64_t n, double alpha, size_t count) {
  std::vector<double> cdf(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    sum += std::pow(static_cast<double>(r + 1), -alpha);
    cdf[static_cast<size_t>(r)] = sum;
  }
  std::vector<uint64_t> ids(count);
  uint64_t state = 12345;
  for (size_t i = 0; i < count; ++i) {
    state += 0x9e3779b97f4a7c15ULL;
    const double u = static_cast<double>(Mix64(state) >> 11) * 0x1.0p-53 * sum;
    const size_t r = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
    ids[i] = Mix64(std::min<size_t>(r, static_cast<size_t>(n - 1)));
  }
  return ids;
}

// The baseline: a plain map from id to a row of an arena holding the value
// and the row-wise Adagrad accumulator.
class PlainTable {
 public:
  explicit PlainTable(int dim) : dim_(dim), stride_(dim + 1) {}

  void Lookup(const uint64_t* ids, size_t n, float* out) {
    for (size_t i = 0; i < n; ++i) {
      auto [it, fresh] = index_.try_emplace(ids[i], static_cast<uint32_t>(index_.size()));
      if (fresh) {
        arena_.resize(arena_.size() + stride_);
        float* row = &arena_[static_cast<size_t>(it->second) * stride_];
        for (int j = 0; j < dim_; ++j) row[j] = 0.01f * static_cast<float>(j);
        row[dim_] = 0.0f;
      }
      std::memcpy(out + i * dim_, &arena_[static_cast<size_t>(it->second) * stride_],
                  sizeof(float) * dim_);
    }
  }

  void Apply(const uint64_t* ids, size_t n, const float* grads, float lr) {
    for (size_t i = 0; i < n; ++i) {
      auto it = index_.find(ids[i]);
      if (it == index_.end()) continue;
      float* w = &arena_[static_cast<size_t>(it->second) * stride_];
      const float* g = grads + i * dim_;
      float sum_sq = 0;
      for (int j = 0; j < dim_; ++j) sum_sq += g[j] * g[j];
      w[dim_] += sum_sq / dim_;
      const float step = lr / (std::sqrt(w[dim_]) + 1e-10f);
      for (int j = 0; j < dim_; ++j) w[j] -= step * g[j];
    }
  }

  void Reserve(size_t rows) {
    index_.reserve(rows);
    arena_.reserve(rows * stride_);
  }

 private:
  int dim_;
  size_t stride_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<float> arena_;
};

absl::Status Run(const std::string& command_line) {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const size_t batch = static_cast<size_t>(absl::GetFlag(FLAGS_batch));
  const int batches = absl::GetFlag(FLAGS_batches);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rows < 1 || dim < 1 || batch < 1 || batches < 1 || rounds < 1) {
    return absl::InvalidArgumentError("--rows, --dim, --batch, --batches, --rounds must be >= 1");
  }

  PlainTable plain(dim);

  // Fill both with every rank's id, measuring RSS growth.
  std::vector<uint64_t> fill(65536);
  std::vector<float> out(std::max(fill.size(), batch) * dim);
  const int64_t rss0 = RssBytes();
  sparse::TableConfig config;
  config.name = "bench";
  config.dim = dim;
  config.optimizer.kind = sparse::SparseOptimizerKind::kRowWiseAdagrad;
  config.optimizer.learning_rate = 0.01f;
  config.eviction.capacity = rows;
  const std::string storage = absl::GetFlag(FLAGS_storage);
  if (storage == "bf16") {
    config.storage = sparse::RowStorage::kBf16;
  } else if (storage != "f32") {
    return absl::InvalidArgumentError("--storage must be f32 or bf16");
  }
  sparse::TableLimits limits;
  limits.max_rows = std::max<int64_t>(rows, limits.max_rows);
  ASSIGN_OR_RETURN(std::unique_ptr<sparse::EmbeddingTable> table,
                   sparse::EmbeddingTable::Create(config, limits));
  const auto t_fill0 = Clock::now();
  for (int64_t r = 0; r < rows; r += fill.size()) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(fill.size(), rows - r));
    for (size_t i = 0; i < n; ++i) fill[i] = Mix64(static_cast<uint64_t>(r) + i);
    table->LookupForTraining(absl::MakeConstSpan(fill.data(), n), 1, out.data());
  }
  const auto t_fill1 = Clock::now();
  const int64_t rss1 = RssBytes();
  for (int64_t r = 0; r < rows; r += fill.size()) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(fill.size(), rows - r));
    for (size_t i = 0; i < n; ++i) fill[i] = Mix64(static_cast<uint64_t>(r) + i);
    plain.Lookup(fill.data(), n, out.data());
  }
  const auto t_fill2 = Clock::now();
  const int64_t rss2 = RssBytes();
  const double table_bytes_per_row = static_cast<double>(rss1 - rss0) / rows;
  const double plain_bytes_per_row = static_cast<double>(rss2 - rss1) / rows;

  std::fprintf(stderr, "drawing %d x %zu Zipf ids...\n", batches, batch);
  const std::vector<uint64_t> ids = ZipfIds(rows, absl::GetFlag(FLAGS_alpha), batch * batches);
  // Each batch's unique ids, and gradients for them.
  std::vector<std::vector<uint64_t>> unique(batches);
  size_t unique_total = 0;
  for (int b = 0; b < batches; ++b) {
    unique[b].assign(ids.begin() + b * batch, ids.begin() + (b + 1) * batch);
    std::sort(unique[b].begin(), unique[b].end());
    unique[b].erase(std::unique(unique[b].begin(), unique[b].end()), unique[b].end());
    unique_total += unique[b].size();
  }
  std::vector<float> grads(batch * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 1e-3f * static_cast<float>(i % 7) - 3e-3f;

  std::vector<double> t_lookup, p_lookup, t_apply, p_apply;
  for (int round = 0; round < rounds; ++round) {
    auto a = Clock::now();
    for (int b = 0; b < batches; ++b) {
      table->LookupForTraining(absl::MakeConstSpan(ids.data() + b * batch, batch), 2, out.data());
    }
    auto c = Clock::now();
    for (int b = 0; b < batches; ++b) plain.Lookup(ids.data() + b * batch, batch, out.data());
    auto d = Clock::now();
    t_lookup.push_back(batch * batches / Seconds(a, c));
    p_lookup.push_back(batch * batches / Seconds(c, d));
    a = Clock::now();
    for (int b = 0; b < batches; ++b) table->Apply(unique[b], grads.data(), 2, 1.0f);
    c = Clock::now();
    for (int b = 0; b < batches; ++b) {
      plain.Apply(unique[b].data(), unique[b].size(), grads.data(), 0.01f);
    }
    d = Clock::now();
    t_apply.push_back(unique_total / Seconds(a, c));
    p_apply.push_back(unique_total / Seconds(c, d));
  }
  std::vector<double> r_lookup, r_apply;
  for (int i = 0; i < rounds; ++i) {
    r_lookup.push_back(t_lookup[i] / p_lookup[i]);
    r_apply.push_back(t_apply[i] / p_apply[i]);
  }

  std::string table_text = absl::StrCat(
      bench::CommonHeader(command_line),
      absl::StrFormat("# rows %d, dim %d, table values stored %s (the plain map's f32), "
                      "row-wise Adagrad, Zipf alpha %.2f, batch %zu "
                      "(%.0f unique on average), %d rounds of %d batches, one thread\n",
                      rows, dim, storage, absl::GetFlag(FLAGS_alpha), batch,
                      static_cast<double>(unique_total) / batches, rounds, batches),
      absl::StrFormat("%-32s %14s %14s %8s\n", "operation", "table M/s", "plain map M/s",
                      "ratio"),
      absl::StrFormat("%-32s %14.2f %14.2f %8.2f\n", "lookup (find-or-create + copy)",
                      bench::Median(t_lookup) / 1e6, bench::Median(p_lookup) / 1e6,
                      bench::Median(r_lookup)),
      absl::StrFormat("%-32s %14.2f %14.2f %8.2f\n", "apply (row-wise Adagrad)",
                      bench::Median(t_apply) / 1e6, bench::Median(p_apply) / 1e6,
                      bench::Median(r_apply)),
      absl::StrFormat("%-32s %14.2f %14.2f %8.2f\n", "fill (insert every row)",
                      rows / Seconds(t_fill0, t_fill1) / 1e6, rows / Seconds(t_fill1, t_fill2) / 1e6,
                      Seconds(t_fill1, t_fill2) / Seconds(t_fill0, t_fill1)),
      absl::StrFormat("%-32s %14.1f %14.1f\n", "RSS growth per row, bytes", table_bytes_per_row,
                      plain_bytes_per_row),
      absl::StrFormat("# table: %d rows, %.1f bytes per row allocated (record %d bytes; "
                      "the index at %.0f%% load)\n",
                      table->rows(), static_cast<double>(table->bytes()) / table->rows(),
                      table->record_bytes(), 100.0 * rows / (rows + rows / 7 + 1)));
  std::printf("%s", table_text.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) {
    RETURN_IF_ERROR(bench::WriteTable(absl::GetFlag(FLAGS_out), table_text));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) {
  const std::string command_line = shardtrain::bench::StartBenchmark(
      argc, argv,
      "sparse_table_bench: a sparse table's find-or-create and row-wise Adagrad apply, "
      "rows/s per core, against a plain flat_hash_map and row arena in the same run");
  const absl::Status status = shardtrain::Run(command_line);
  if (!status.ok()) {
    std::fprintf(stderr, "sparse_table_bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
