// TableCall: the Python handle of a table call started with
// lookup_async() or push_sparse_async() (shardtrain.TableCall).
//
// It holds the call's buffers (the rows a lookup writes, the gradients a
// push reads) exported until the call has run, so they stay put while the
// client's table thread uses them; the caller must not change them before
// wait() returns. wait() returns the call's stats or raises its error;
// destroying a handle whose call has not run waits for it first, so a
// dropped push is still applied and no buffer is freed under the thread.
//
//   call = client.push_sparse_async("user", ids, grads, clock)
//   ...                                    # compute
//   call.wait()                            # dict(ids, unique_ids, ...)
//
// Create and destroy with the GIL held; Wait() releases it while it waits.
#ifndef SHARDTRAIN_PYTHON_SRC_TABLE_CALL_H_
#define SHARDTRAIN_PYTHON_SRC_TABLE_CALL_H_

#include <memory>

#include <pybind11/pybind11.h>

#include "python/src/buffers.h"
#include "python/src/table_queue.h"

namespace shardtrain::python {

class TableCall {
 public:
  TableCall(std::shared_ptr<const TableQueue::Call> call, FloatBuffer buffer);
  // Waits for the call (GIL released) before the buffer goes.
  ~TableCall();
  TableCall(const TableCall&) = delete;
  TableCall& operator=(const TableCall&) = delete;

  bool done() const { return call_->done(); }
  // Blocks until the call has run: dict(ids, unique_ids, dropped,
  // duplicates), or ShardtrainError with the call's status.
  pybind11::dict Wait();

 private:
  std::shared_ptr<const TableQueue::Call> call_;
  FloatBuffer buffer_;
};

// dict(ids, unique_ids, dropped, duplicates) of a table call's stats.
pybind11::dict TableStatsDict(const client::TableCallStats& stats);

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_TABLE_CALL_H_
