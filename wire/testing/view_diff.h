// Field-by-field comparison of message views (wire/message_views.h),
// for tests and the wire fuzz target: a view parsed from received slices
// against the view of the stock message (ViewOf) the same bytes parse to.
//
//   EXPECT_EQ(DiffViews(parsed, ViewOf(stock)), "");
//
// Bytes fields compare by content, however they are cut into pieces;
// doubles by bit pattern.
#ifndef SHARDTRAIN_WIRE_TESTING_VIEW_DIFF_H_
#define SHARDTRAIN_WIRE_TESTING_VIEW_DIFF_H_

#include <string>

#include "wire/message_views.h"

namespace shardtrain::wire {

// Empty when equal, else the first difference found.
std::string DiffViews(const PushView& a, const PushView& b);
std::string DiffViews(const PullResponseView& a, const PullResponseView& b);
std::string DiffViews(const PushPullView& a, const PushPullView& b);
std::string DiffViews(const PushPullResponseView& a, const PushPullResponseView& b);

// The view of a stock PushPullRequest / PushPullResponse.
PushPullView ViewOf(const PushPullRequest& message);
PushPullResponseView ViewOf(const PushPullResponse& message);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_TESTING_VIEW_DIFF_H_
