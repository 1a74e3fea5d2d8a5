// LateGradCopy: gradient copies that land after the call that started them,
// as a GPU's do (they run on a copy stream while backward goes on). The
// trainer must send each gradient only once its copy has landed, with and
// without overlapped push/pull, and must report a failed copy as an error.
//
// The copies here land on another thread after a delay, into memory that is
// NaN until then: a gradient sent too early is refused by the shards
// (non-finite), or, if a race let part of it through, changes the result,
// which must equal that of the same training with synchronous copies.
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/one_worker_job.h"
#include "worker/model/model.h"

namespace shardtrain {
namespace {


// Passes when a copy running on its own thread has landed.
class LateFence final : public worker::Fence {
 public:
  explicit LateFence(std::future<absl::Status> landed)
      : landed_(landed.share()) {}
  absl::Status Wait() override { return landed_.get(); }

 private:
  std::shared_future<absl::Status> landed_;
};

// A model whose StartGradCopy lands its copy 3 ms later on another thread,
// or fails with `copy_error` when that is not OK.
class LateCopyModel final : public worker::Model {
 public:
  LateCopyModel(std::unique_ptr<worker::Model> inner, absl::Status copy_error)
      : inner_(std::move(inner)),
        copy_error_(std::move(copy_error)),
        host_(inner_->params().size()) {}

  const std::vector<worker::ParamInfo>& params() const override { return inner_->params(); }
  absl::Status SetParam(int index, absl::Span<const float> values) override {
    return inner_->SetParam(index, values);
  }
  absl::Status GetParam(int index, absl::Span<float> out) const override {
    return inner_->GetParam(index, out);
  }
  absl::StatusOr<std::unique_ptr<worker::HostPin>> PinParamHost(int index,
                                                                absl::Span<float> host) override {
    return inner_->PinParamHost(index, host);
  }
  absl::StatusOr<float> ForwardBackward(const float* x, const int32_t* labels, int batch,
                                        const std::function<void(int)>& on_grad_ready) override {
    return inner_->ForwardBackward(x, labels, batch, on_grad_ready);
  }
  absl::Status GetGrad(int index, absl::Span<float> out) const override {
    return inner_->GetGrad(index, out);
  }
  absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels, int batch) override {
    return inner_->CountCorrect(x, labels, batch);
  }

  absl::StatusOr<worker::PendingGrad> StartGradCopy(int index) override {
    std::vector<float>& host = host_[index];
    host.assign(worker::NumElements(inner_->params()[index]),
                std::numeric_limits<float>::quiet_NaN());
    std::vector<float> grad(host.size());
    absl::Status got = inner_->GetGrad(index, absl::MakeSpan(grad));
    if (!got.ok()) return got;
    std::future<absl::Status> landed = std::async(
        std::launch::async, [&host, grad = std::move(grad), error = copy_error_] {
          std::this_thread::sleep_for(std::chrono::milliseconds(3));
          if (!error.ok()) return error;
          std::copy(grad.begin(), grad.end(), host.begin());
          return absl::OkStatus();
        });
    return worker::PendingGrad{host, std::make_unique<LateFence>(std::move(landed))};
  }

 private:
  std::unique_ptr<worker::Model> inner_;
  const absl::Status copy_error_;
  std::vector<std::vector<float>> host_;  // Per parameter; sized once.
};

class LateGradCopy : public ::testing::TestWithParam<bool> {
 protected:
  // Trains one worker; `late` wraps its model in LateCopyModel. Returns the
  // parameters afterwards, or the first error.
  absl::StatusOr<std::vector<std::vector<float>>> Train(bool late, absl::Status copy_error) {
    testutil::OneWorkerJob job;
    job.overlap = GetParam();
    if (late) {
      job.wrap_model = [copy_error](std::unique_ptr<worker::Model> model) {
        return std::unique_ptr<worker::Model>(
            std::make_unique<LateCopyModel>(std::move(model), copy_error));
      };
    }
    absl::StatusOr<testutil::OneWorkerResult> result = testutil::RunOneWorkerJob(job);
    if (!result.ok()) return result.status();
    return result->params;
  }
};

TEST_P(LateGradCopy, SendsEachGradientOnlyOnceItsCopyHasLanded) {
  auto late = Train(/*late=*/true, absl::OkStatus());
  ASSERT_TRUE(late.ok()) << late.status();
  auto prompt = Train(/*late=*/false, absl::OkStatus());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ASSERT_EQ(late->size(), prompt->size());
  for (size_t i = 0; i < late->size(); ++i) {
    EXPECT_EQ((*late)[i], (*prompt)[i]) << "parameter " << i;
  }
}

TEST_P(LateGradCopy, AFailedCopyFailsTheStep) {
  auto trained = Train(/*late=*/true, absl::DataLossError("device lost"));
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kDataLoss) << trained.status();
  EXPECT_NE(trained.status().message().find("device lost"), std::string::npos)
      << trained.status();
}

INSTANTIATE_TEST_SUITE_P(Overlap, LateGradCopy, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Overlapped")
                                             : std::string("Sequential");
                         });

}  // namespace
}  // namespace shardtrain
