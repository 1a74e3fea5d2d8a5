#include "python/src/table_call.h"

#include <utility>

#include "python/src/errors.h"

namespace shardtrain::python {
namespace py = pybind11;

TableCall::TableCall(std::shared_ptr<const TableQueue::Call> call, FloatBuffer buffer)
    : call_(std::move(call)), buffer_(std::move(buffer)) {}

TableCall::~TableCall() {
  if (!call_->done()) {
    py::gil_scoped_release release;
    call_->Wait();
  }
}

py::dict TableCall::Wait() {
  if (!call_->done()) {
    py::gil_scoped_release release;
    call_->Wait();
  }
  ThrowIfError(call_->status());
  return TableStatsDict(call_->stats());
}

py::dict TableStatsDict(const client::TableCallStats& stats) {
  py::dict out;
  out["ids"] = stats.ids;
  out["unique_ids"] = stats.unique_ids;
  out["dropped"] = stats.dropped;
  out["duplicates"] = stats.duplicates;
  return out;
}

}  // namespace shardtrain::python
