// Reading a process's Prometheus metrics the way Prometheus does: an HTTP
// GET of /metrics on its metrics port, and the samples summed by name.
//
//   ASSIGN_OR_RETURN(std::string body, HttpGet(metrics_port, "/metrics"));
//   double applied = SumByName(body)["shardtrain_updates_applied_total"];
//   double lookups = SumByName(body, {"method=\"Lookup\""})["shardtrain_rpc_requests_total"];
//
// Thread-safe.
#ifndef SHARDTRAIN_TESTING_METRICS_SCRAPE_H_
#define SHARDTRAIN_TESTING_METRICS_SCRAPE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardtrain::testutil {

// GET http://127.0.0.1:<port><path> (5 s socket timeouts); the body of a
// 200 answer, UNAVAILABLE for another status or no connection.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// Sums the samples of each metric name in a Prometheus text exposition
// (all label sets together), or only those whose labels include every one
// of `labels`, each written as in the exposition (method="Lookup").
std::map<std::string, double> SumByName(const std::string& exposition,
                                        const std::vector<std::string>& labels = {});

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_METRICS_SCRAPE_H_
