#include "testing/metrics_scrape.h"

#include <string>

#include "gtest/gtest.h"

namespace shardtrain::testutil {
namespace {

constexpr char kExposition[] =
    "# HELP shardtrain_rpc_requests_total Calls.\n"
    "# TYPE shardtrain_rpc_requests_total counter\n"
    "shardtrain_rpc_requests_total{method=\"Lookup\",side=\"server\"} 3\n"
    "shardtrain_rpc_requests_total{method=\"Lookup\",side=\"client\"} 5\n"
    "shardtrain_rpc_requests_total{method=\"LookupMore\",side=\"server\"} 7\n"
    "shardtrain_rpc_requests_total{side=\"server\",method=\"Push\"} 11\n"
    "shardtrain_up 1\n";

TEST(SumByNameTest, SumsEveryLabelSetOrThoseWithTheGivenLabels) {
  EXPECT_EQ(SumByName(kExposition)["shardtrain_rpc_requests_total"], 26);
  EXPECT_EQ(SumByName(kExposition)["shardtrain_up"], 1);
  EXPECT_EQ(SumByName(kExposition, {"method=\"Lookup\""})["shardtrain_rpc_requests_total"], 8);
  EXPECT_EQ(SumByName(kExposition,
                      {"method=\"Lookup\"", "side=\"server\""})["shardtrain_rpc_requests_total"],
            3);
  EXPECT_EQ(SumByName(kExposition, {"side=\"server\""})["shardtrain_rpc_requests_total"], 21);
  // A sample without labels has none of them.
  EXPECT_EQ(SumByName(kExposition, {"side=\"server\""}).count("shardtrain_up"), 0u);
}

}  // namespace
}  // namespace shardtrain::testutil
