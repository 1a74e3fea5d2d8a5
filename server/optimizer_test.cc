#include "server/optimizer.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {
namespace {

// Starting parameters and one gradient per step, chosen so every element sees
// gradients of changing sign and size.
const std::vector<double> kInitialParams = {0.5, -1.0, 2.0, 0.25};
const std::vector<std::vector<double>> kGrads = {
    {0.1, -0.2, 0.3, 0.0},
    {-0.4, 0.5, 0.1, 1.5},
    {0.05, 0.3, -0.7, -0.2},
    {0.2, -0.1, 0.0, 0.6},
};

// Parameters and slots of one partition, in float as the server holds them.
struct Partition {
  std::vector<float> params;
  std::vector<std::vector<float>> slots;

  std::vector<float*> SlotPointers(size_t offset) {
    std::vector<float*> pointers;
    for (std::vector<float>& slot : slots) pointers.push_back(slot.data() + offset);
    return pointers;
  }
};

Partition MakePartition(const Optimizer& optimizer,
                        const std::vector<double>& initial) {
  Partition partition;
  partition.params.assign(initial.begin(), initial.end());
  for (int s = 0; s < optimizer.num_slots(); ++s) {
    partition.slots.emplace_back(initial.size(), optimizer.InitialSlotValue(s));
  }
  return partition;
}

std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Runs every step of kGrads through a fresh optimizer and returns the params.
std::vector<float> RunSteps(const OptimizerOptions& options,
                            float lr_scale = 1.0f) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(options);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  if (!optimizer.ok()) return {};
  Partition partition = MakePartition(**optimizer, kInitialParams);
  for (size_t step = 0; step < kGrads.size(); ++step) {
    const std::vector<float> grad = ToFloat(kGrads[step]);
    const std::vector<float*> slots = partition.SlotPointers(0);
    (*optimizer)->Apply(step, lr_scale, absl::MakeSpan(partition.params), grad,
                        slots);
  }
  return partition.params;
}

// Within 1e-6 of the expected value, relative, or of `floor` for values
// below it (float's rounding of the larger terms a small result came from).
void ExpectClose(const std::vector<float>& actual,
                 const std::vector<double>& expected, double floor = 1e-2) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tolerance = 1e-6 * std::max(std::abs(expected[i]), floor);
    EXPECT_NEAR(actual[i], expected[i], tolerance) << "element " << i;
  }
}

// `rule` is an optimizer name, optionally with ":period" (delayed_nesterov)
// or "+dc" (delay compensation with lambda 0.5) appended.
OptimizerOptions Options(const std::string& rule) {
  OptimizerOptions options;
  options.name = rule;
  options.learning_rate = 0.1f;
  if (const size_t colon = rule.find(':'); colon != std::string::npos) {
    options.name = rule.substr(0, colon);
    options.period = std::stoll(rule.substr(colon + 1));
  }
  if (const size_t plus = rule.find("+dc"); plus != std::string::npos) {
    options.name = rule.substr(0, plus);
    options.delay_compensation = 0.5f;
  }
  return options;
}

// The references below re-derive each rule from PyTorch's documentation in
// double precision, one scalar at a time, independently of optimizer.cc.

std::vector<double> ReferenceSgd(double lr, double wd) {
  std::vector<double> p = kInitialParams;
  for (const std::vector<double>& g : kGrads) {
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * (g[i] + wd * p[i]);
  }
  return p;
}

std::vector<double> ReferenceMomentum(double lr, double mu, double wd,
                                      bool nesterov) {
  std::vector<double> p = kInitialParams;
  std::vector<double> buf(p.size(), 0.0);
  for (size_t t = 0; t < kGrads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double d = kGrads[t][i] + wd * p[i];
      buf[i] = t == 0 ? d : mu * buf[i] + d;  // PyTorch: buf = clone(d) first.
      p[i] -= lr * (nesterov ? d + mu * buf[i] : buf[i]);
    }
  }
  return p;
}

std::vector<double> ReferenceAdam(double lr, double b1, double b2, double eps,
                                  double wd, bool decoupled) {
  std::vector<double> p = kInitialParams;
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = kGrads[t - 1][i];
      if (decoupled) {
        p[i] = p[i] - lr * wd * p[i];
      } else {
        d = d + wd * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      const double m_hat = m[i] / (1 - std::pow(b1, t));
      const double v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  return p;
}

std::vector<double> ReferenceAdagrad(double lr, double initial, double eps,
                                     double wd) {
  std::vector<double> p = kInitialParams;
  std::vector<double> acc(p.size(), initial);
  for (const std::vector<double>& g : kGrads) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double d = g[i] + wd * p[i];
      acc[i] += d * d;
      p[i] -= lr * d / (std::sqrt(acc[i]) + eps);
    }
  }
  return p;
}

TEST(OptimizerTest, Sgd) {
  ExpectClose(RunSteps(Options("sgd")), ReferenceSgd(0.1, 0.0));
  // First step by hand: 0.5 - 0.1 * 0.1.
  OptimizerOptions options = Options("sgd");
  auto optimizer = Optimizer::Create(options).value();
  std::vector<float> p = {0.5f};
  std::vector<float> g = {0.1f};
  optimizer->Apply(0, 1.0f, absl::MakeSpan(p), g, {});
  EXPECT_FLOAT_EQ(p[0], 0.49f);
}

TEST(OptimizerTest, SgdWeightDecay) {
  OptimizerOptions options = Options("sgd");
  options.weight_decay = 0.05f;
  ExpectClose(RunSteps(options), ReferenceSgd(0.1, 0.05f));
}

TEST(OptimizerTest, Momentum) {
  OptimizerOptions options = Options("momentum");
  options.momentum = 0.9f;
  ExpectClose(RunSteps(options), ReferenceMomentum(0.1, 0.9f, 0.0, false));
  options.weight_decay = 0.01f;
  ExpectClose(RunSteps(options), ReferenceMomentum(0.1, 0.9f, 0.01f, false));
}

TEST(OptimizerTest, Nesterov) {
  OptimizerOptions options = Options("nesterov");
  options.momentum = 0.8f;
  ExpectClose(RunSteps(options), ReferenceMomentum(0.1, 0.8f, 0.0, true));
  options.weight_decay = 0.01f;
  ExpectClose(RunSteps(options), ReferenceMomentum(0.1, 0.8f, 0.01f, true));
}

// Delayed Nesterov with period 1 is torch's Nesterov SGD, bit for bit.
TEST(OptimizerTest, DelayedNesterovWithPeriodOneIsNesterov) {
  for (float wd : {0.0f, 0.01f}) {
    OptimizerOptions delayed = Options("delayed_nesterov");
    delayed.momentum = 0.8f;
    delayed.weight_decay = wd;
    OptimizerOptions nesterov = delayed;
    nesterov.name = "nesterov";
    ExpectClose(RunSteps(delayed), ReferenceMomentum(0.1, 0.8f, wd, true));
    const std::vector<float> a = RunSteps(delayed), b = RunSteps(nesterov);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "element " << i;
  }
}

// Period N: N pushes move the parameters as one Nesterov step on their mean
// gradient does (gradients that do not depend on the parameters, no weight
// decay), its first push also applying the momentum part of that step.
TEST(OptimizerTest, DelayedNesterovPeriodIsOneNesterovStepOnTheMean) {
  const double lr = 0.1, mu = 0.9;
  OptimizerOptions options = Options("delayed_nesterov:2");
  options.momentum = static_cast<float>(mu);
  auto optimizer = Optimizer::Create(options).value();
  Partition partition = MakePartition(*optimizer, kInitialParams);
  std::vector<double> p = kInitialParams, buf(p.size(), 0.0);
  for (size_t t = 0; t < kGrads.size(); ++t) {
    const std::vector<float> grad = ToFloat(kGrads[t]);
    optimizer->Apply(static_cast<int64_t>(t), 1.0f, absl::MakeSpan(partition.params), grad,
                     partition.SlotPointers(0));
    if (t % 2 == 0) {
      // The first push of a period: the momentum part of the period's step,
      // which its gradients do not change, and this push's share of the
      // gradient part.
      std::vector<double> expected = p;
      for (size_t i = 0; i < p.size(); ++i) {
        expected[i] -= lr * mu * mu * buf[i] + lr * (1 + mu) * kGrads[t][i] / 2;
      }
      // The parameters, about 1, move by terms that nearly cancel.
      ExpectClose(partition.params, expected, /*floor=*/0.1);
      continue;
    }
    for (size_t i = 0; i < p.size(); ++i) {  // Nesterov on the pair's mean
      const double mean = (kGrads[t - 1][i] + kGrads[t][i]) / 2;
      buf[i] = mu * buf[i] + mean;
      p[i] -= lr * (mean + mu * buf[i]);
    }
    ExpectClose(partition.params, p, /*floor=*/0.1);
    for (float sum : partition.slots[1]) EXPECT_EQ(sum, 0.0f) << "push " << t;
  }
}

// DC-ASGD as MXNet's DCASGD (momentum 0) computes it, in double:
//   mom = -lr * (g + wd * w + lambda * g * g * (w - previous_weight))
//   previous_weight = w;  w += mom
std::vector<double> ReferenceDcSgd(const std::vector<double>& initial,
                                   const std::vector<std::vector<double>>& grads, double lr,
                                   double wd, double lambda) {
  std::vector<double> w = initial, previous = initial;
  for (const std::vector<double>& g : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      const double mom = -lr * (g[i] + wd * w[i] + lambda * g[i] * g[i] * (w[i] - previous[i]));
      previous[i] = w[i];
      w[i] += mom;
    }
  }
  return w;
}

TEST(OptimizerTest, DelayCompensationMatchesMxnetDcasgd) {
  for (float wd : {0.0f, 0.01f}) {
    OptimizerOptions options = Options("sgd+dc");
    options.weight_decay = wd;
    ExpectClose(RunSteps(options), ReferenceDcSgd(kInitialParams, kGrads, 0.1, wd, 0.5));
  }
  // Longer than the compensation's chunk, with a tail.
  const size_t n = 1300;
  std::vector<double> initial(n);
  std::vector<std::vector<double>> grads(3, std::vector<double>(n));
  for (size_t i = 0; i < n; ++i) {
    initial[i] = std::sin(0.1 * static_cast<double>(i));
    for (size_t t = 0; t < grads.size(); ++t) {
      grads[t][i] = std::cos(0.7 * static_cast<double>(i + 31 * t));
    }
  }
  auto optimizer = Optimizer::Create(Options("sgd+dc")).value();
  ASSERT_EQ(optimizer->num_slots(), 1);
  Partition partition = MakePartition(*optimizer, initial);
  for (size_t t = 0; t < grads.size(); ++t) {
    optimizer->Apply(static_cast<int64_t>(t), 1.0f, absl::MakeSpan(partition.params),
                     ToFloat(grads[t]), partition.SlotPointers(0));
  }
  // Absolute: float sums of O(1) terms that cancel to ~1e-3 keep ~1e-8.
  const std::vector<double> expected = ReferenceDcSgd(initial, grads, 0.1, 0.0, 0.5);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(partition.params[i], expected[i], 1e-6) << "element " << i;
  }
}

// Adam applies the compensated gradient; its bias corrections are Adam's.
TEST(OptimizerTest, DelayCompensationUnderAdam) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, lambda = 0.5;
  std::vector<double> p = kInitialParams, m(p.size()), v(p.size()), last(p.size());
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[t - 1][i];
      const double c = g + lambda * g * g * last[i];
      m[i] = b1 * m[i] + (1 - b1) * c;
      v[i] = b2 * v[i] + (1 - b2) * c * c;
      const double step = lr * (m[i] / (1 - std::pow(b1, t))) /
                          (std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps);
      p[i] -= step;
      last[i] = -step;
    }
  }
  ExpectClose(RunSteps(Options("adam+dc")), p);
}

TEST(OptimizerTest, Adam) {
  OptimizerOptions options = Options("adam");
  options.learning_rate = 0.01f;
  ExpectClose(RunSteps(options),
              ReferenceAdam(0.01f, 0.9f, 0.999f, 1e-8f, 0.0, false));
  options.weight_decay = 0.1f;
  options.beta1 = 0.8f;
  options.beta2 = 0.99f;
  options.epsilon = 1e-3f;
  ExpectClose(RunSteps(options),
              ReferenceAdam(0.01f, 0.8f, 0.99f, 1e-3f, 0.1f, false));
}

TEST(OptimizerTest, AdamW) {
  OptimizerOptions options = Options("adamw");
  options.learning_rate = 0.01f;
  options.weight_decay = 0.1f;
  ExpectClose(RunSteps(options),
              ReferenceAdam(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, true));
  // Decoupled decay differs from Adam's L2 decay.
  OptimizerOptions adam = options;
  adam.name = "adam";
  EXPECT_NE(RunSteps(options), RunSteps(adam));
}

TEST(OptimizerTest, Adagrad) {
  OptimizerOptions options = Options("adagrad");
  options.epsilon = 1e-10f;
  ExpectClose(RunSteps(options), ReferenceAdagrad(0.1, 0.1f, 1e-10f, 0.0));
  options.weight_decay = 0.02f;
  options.adagrad_initial_accumulator = 0.0f;
  ExpectClose(RunSteps(options), ReferenceAdagrad(0.1, 0.0, 1e-10f, 0.02f));
}

TEST(OptimizerTest, SlotsAndInitialValues) {
  const struct {
    const char* name;
    int slots;
  } kCases[] = {{"sgd", 0},  {"momentum", 1}, {"nesterov", 1},
                {"adam", 2}, {"adamw", 2},    {"adagrad", 1},
                {"delayed_nesterov", 2}, {"sgd+dc", 1}, {"adam+dc", 3},
                {"adagrad+dc", 2}};
  for (const auto& c : kCases) {
    OptimizerOptions options = Options(c.name);
    options.adagrad_initial_accumulator = 0.25f;
    auto optimizer = Optimizer::Create(options).value();
    EXPECT_EQ(optimizer->num_slots(), c.slots) << c.name;
    EXPECT_LE(optimizer->num_slots(), Optimizer::kMaxSlots) << c.name;
    EXPECT_EQ(optimizer->options().name, options.name);
    for (int s = 0; s < optimizer->num_slots(); ++s) {
      // Adagrad's accumulator comes first; the compensation slot is last.
      const bool accumulator = options.name == "adagrad" && s == 0;
      EXPECT_EQ(optimizer->InitialSlotValue(s), accumulator ? 0.25f : 0.0f) << c.name;
    }
  }
}

const char* const kAllNames[] = {"sgd",     "momentum",           "nesterov",
                                 "adam",    "adamw",              "adagrad",
                                 "delayed_nesterov:1", "delayed_nesterov:2", "sgd+dc",
                                 "adam+dc", "adagrad+dc"};

OptimizerOptions WithDecay(const char* name) {
  OptimizerOptions options = Options(name);
  options.weight_decay = 0.01f;
  return options;
}

// Element-wise rules give the same result whether a partition is updated
// whole or as sub-spans (as the server does across threads).
TEST(OptimizerTest, SplitSpansMatchWhole) {
  const std::vector<double> initial = {0.5, -1.0, 2.0, 0.25, -0.3, 1.1, 0.7};
  const std::vector<double> grad_d = {0.1, -0.2, 0.3, 0.0, 0.9, -0.6, 0.05};
  const std::vector<float> grad = ToFloat(grad_d);
  for (const char* name : kAllNames) {
    auto optimizer = Optimizer::Create(WithDecay(name)).value();
    Partition whole = MakePartition(*optimizer, initial);
    Partition split = MakePartition(*optimizer, initial);
    const size_t n = initial.size();
    const size_t half = 3;
    for (int64_t step = 0; step < 3; ++step) {
      optimizer->Apply(step, 1.0f, absl::MakeSpan(whole.params), grad,
                       whole.SlotPointers(0));
      optimizer->Apply(step, 1.0f, absl::MakeSpan(split.params).subspan(0, half),
                       absl::MakeConstSpan(grad).subspan(0, half),
                       split.SlotPointers(0));
      optimizer->Apply(step, 1.0f, absl::MakeSpan(split.params).subspan(half),
                       absl::MakeConstSpan(grad).subspan(half),
                       split.SlotPointers(half));
    }
    for (size_t i = 0; i < n; ++i) {
      EXPECT_FLOAT_EQ(split.params[i], whole.params[i]) << name << " " << i;
      for (size_t s = 0; s < whole.slots.size(); ++s) {
        EXPECT_FLOAT_EQ(split.slots[s][i], whole.slots[s][i]) << name;
      }
    }
  }
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// The gradient read straight from received bytes (any dtype, in pieces cut
// at odd places, each run its own loop) updates parameters and slots bit for
// bit as decoding it into floats and calling Apply does.
TEST(OptimizerTest, PayloadInPiecesMatchesDecodedFloats) {
  const size_t n = 301;  // vector loops with a tail, runs of odd length
  std::vector<double> initial(n), grad_d(n);
  for (size_t i = 0; i < n; ++i) {
    initial[i] = std::sin(0.37 * static_cast<double>(i)) * 2.0;
    grad_d[i] = std::cos(1.3 * static_cast<double>(i)) * (i % 7 == 0 ? 1e-3 : 0.8);
  }
  const std::vector<float> grad = ToFloat(grad_d);
  for (const char* name : kAllNames) {
    for (DType dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
      std::string bytes;
      common::EncodeDense(grad, dtype, &bytes);
      std::vector<float> decoded(n);
      ASSERT_TRUE(common::DecodeDense(dtype, bytes, absl::MakeSpan(decoded)).ok());
      // The bytes at an odd address, in pieces that split elements.
      const std::string buffer = "x" + bytes;
      const absl::string_view all = absl::string_view(buffer).substr(1);
      wire::PayloadView payload;
      payload.dtype = dtype;
      payload.encoding = ENCODING_DENSE;
      for (size_t begin = 0; begin < all.size();) {
        const size_t length = std::min<size_t>(all.size() - begin, 3 + begin % 97);
        payload.data.Append(all.substr(begin, length));
        begin += length;
      }
      ASSERT_TRUE(wire::CheckDense(payload, n).ok());

      auto optimizer = Optimizer::Create(WithDecay(name)).value();
      Partition floats = MakePartition(*optimizer, initial);
      Partition wire = MakePartition(*optimizer, initial);
      for (int64_t step = 0; step < 3; ++step) {
        optimizer->Apply(step, 0.5f, absl::MakeSpan(floats.params), decoded,
                         floats.SlotPointers(0));
        optimizer->ApplyPayload(step, 0.5f, payload, absl::MakeSpan(wire.params),
                                wire.SlotPointers(0));
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(wire.params[i]), Bits(floats.params[i]))
            << name << " " << common::DTypeName(dtype) << " element " << i;
        for (size_t s = 0; s < floats.slots.size(); ++s) {
          ASSERT_EQ(Bits(wire.slots[s][i]), Bits(floats.slots[s][i]))
              << name << " " << common::DTypeName(dtype) << " slot " << s;
        }
      }
    }
  }
}

// lr_scale multiplies the learning rate: scale 0.5 at lr 0.1 is lr 0.05.
TEST(OptimizerTest, LrScaleScalesTheRate) {
  for (const char* name : kAllNames) {
    OptimizerOptions options = WithDecay(name);
    const std::vector<float> scaled = RunSteps(options, 0.5f);
    options.learning_rate = 0.05f;
    const std::vector<float> halved = RunSteps(options, 1.0f);
    options.learning_rate = 0.1f;
    const std::vector<float> full = RunSteps(options, 1.0f);
    for (size_t i = 0; i < scaled.size(); ++i) {
      EXPECT_FLOAT_EQ(scaled[i], halved[i]) << name << " " << i;
    }
    EXPECT_NE(scaled, full) << name;
  }
  // For plain SGD a single step moves exactly lr_scale times as far.
  auto sgd = Optimizer::Create(Options("sgd")).value();
  std::vector<float> p = {1.0f};
  std::vector<float> g = {1.0f};
  sgd->Apply(0, 0.25f, absl::MakeSpan(p), g, {});
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.025f);
  sgd->Apply(1, 0.0f, absl::MakeSpan(p), g, {});
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.025f);
}

TEST(OptimizerTest, ScheduleDrivesTheRate) {
  OptimizerOptions options = Options("sgd");
  options.schedule.kind = "step";
  options.schedule.warmup_steps = 2;
  options.schedule.step_size = 3;
  options.schedule.gamma = 0.5f;
  auto optimizer = Optimizer::Create(options).value();
  EXPECT_FLOAT_EQ(optimizer->LearningRate(0), 0.05f);
  EXPECT_FLOAT_EQ(optimizer->LearningRate(1), 0.1f);
  EXPECT_FLOAT_EQ(optimizer->LearningRate(4), 0.1f);
  EXPECT_FLOAT_EQ(optimizer->LearningRate(5), 0.05f);

  std::vector<float> p = {1.0f};
  std::vector<float> g = {1.0f};
  optimizer->Apply(0, 1.0f, absl::MakeSpan(p), g, {});
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  optimizer->Apply(5, 1.0f, absl::MakeSpan(p), g, {});
  EXPECT_FLOAT_EQ(p[0], 0.9f);
}

// With zero state the bias-corrected moments are m_hat = g and v_hat = g^2, so
// Adam's first step is lr * sign(g) whatever the gradient's size.
TEST(OptimizerTest, AdamFirstStepMovesByLearningRate) {
  auto adam = Optimizer::Create(Options("adam")).value();
  Partition partition = MakePartition(*adam, {1.0, 1.0});
  const std::vector<float> grad = {0.3f, -2.0f};
  adam->Apply(0, 1.0f, absl::MakeSpan(partition.params), grad,
              partition.SlotPointers(0));
  EXPECT_NEAR(partition.params[0], 0.9f, 1e-6);
  EXPECT_NEAR(partition.params[1], 1.1f, 1e-6);
}

TEST(OptimizerTest, CreateRejectsBadOptions) {
  using Mutation = void (*)(OptimizerOptions&);
  const struct {
    const char* what;
    Mutation mutate;
  } kCases[] = {
      {"unknown name", [](OptimizerOptions& o) { o.name = "rmsprop"; }},
      {"empty name", [](OptimizerOptions& o) { o.name = ""; }},
      {"lr zero", [](OptimizerOptions& o) { o.learning_rate = 0.0f; }},
      {"lr negative", [](OptimizerOptions& o) { o.learning_rate = -0.1f; }},
      {"lr nan", [](OptimizerOptions& o) { o.learning_rate = NAN; }},
      {"lr inf", [](OptimizerOptions& o) { o.learning_rate = INFINITY; }},
      {"momentum negative", [](OptimizerOptions& o) { o.momentum = -0.1f; }},
      {"momentum one", [](OptimizerOptions& o) { o.momentum = 1.0f; }},
      {"nesterov without momentum",
       [](OptimizerOptions& o) {
         o.name = "nesterov";
         o.momentum = 0.0f;
       }},
      {"delayed_nesterov without momentum",
       [](OptimizerOptions& o) {
         o.name = "delayed_nesterov";
         o.momentum = 0.0f;
       }},
      {"period zero", [](OptimizerOptions& o) { o.period = 0; }},
      {"delay compensation negative",
       [](OptimizerOptions& o) { o.delay_compensation = -0.1f; }},
      {"delay compensation nan", [](OptimizerOptions& o) { o.delay_compensation = NAN; }},
      {"delay compensation under momentum",
       [](OptimizerOptions& o) {
         o.name = "momentum";
         o.delay_compensation = 0.04f;
       }},
      {"delay compensation under delayed_nesterov",
       [](OptimizerOptions& o) {
         o.name = "delayed_nesterov";
         o.delay_compensation = 0.04f;
       }},
      {"beta1 negative", [](OptimizerOptions& o) { o.beta1 = -0.5f; }},
      {"beta1 one", [](OptimizerOptions& o) { o.beta1 = 1.0f; }},
      {"beta2 one", [](OptimizerOptions& o) { o.beta2 = 1.0f; }},
      {"beta2 negative", [](OptimizerOptions& o) { o.beta2 = -0.01f; }},
      {"epsilon zero", [](OptimizerOptions& o) { o.epsilon = 0.0f; }},
      {"epsilon negative", [](OptimizerOptions& o) { o.epsilon = -1e-8f; }},
      {"weight decay negative",
       [](OptimizerOptions& o) { o.weight_decay = -0.01f; }},
      {"weight decay nan", [](OptimizerOptions& o) { o.weight_decay = NAN; }},
      {"adagrad accumulator negative",
       [](OptimizerOptions& o) { o.adagrad_initial_accumulator = -1.0f; }},
      {"unknown schedule",
       [](OptimizerOptions& o) { o.schedule.kind = "exponential"; }},
      {"negative warmup",
       [](OptimizerOptions& o) { o.schedule.warmup_steps = -1; }},
      {"cosine min_lr above lr",
       [](OptimizerOptions& o) {
         o.schedule.kind = "cosine";
         o.schedule.total_steps = 100;
         o.schedule.min_lr = 1.0f;
       }},
  };
  for (const auto& c : kCases) {
    OptimizerOptions options = Options("adam");
    c.mutate(options);
    const absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        Optimizer::Create(options);
    EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
  }
  for (const char* name : kAllNames) {
    EXPECT_TRUE(Optimizer::Create(Options(name)).ok()) << name;
  }
  OptimizerOptions zero_momentum = Options("momentum");
  zero_momentum.momentum = 0.0f;
  EXPECT_TRUE(Optimizer::Create(zero_momentum).ok());
}

TEST(OptimizerTest, UnknownNameMessageListsChoices) {
  const auto optimizer = Optimizer::Create(Options("rmsprop"));
  EXPECT_THAT(optimizer.status().message(), testing::HasSubstr("rmsprop"));
  EXPECT_THAT(optimizer.status().message(), testing::HasSubstr("adamw"));
}

}  // namespace
}  // namespace shardtrain::server
