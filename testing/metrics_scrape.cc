#include "testing/metrics_scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardtrain::testutil {
absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", std::strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string response;
  char buffer[16384];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError("malformed HTTP response");
  }
  if (response.find(" 200 ") > body) {
    return absl::UnavailableError(response.substr(0, response.find("\r\n")));
  }
  return response.substr(body + 4);
}

std::map<std::string, double> SumByName(const std::string& exposition,
                                        const std::vector<std::string>& labels) {
  std::map<std::string, double> sums;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_start = line.rfind(' ');
    if (name_end == absl::string_view::npos || value_start == absl::string_view::npos) continue;
    if (!labels.empty()) {
      // {a="x",b="y"} as ,a="x",b="y", so that every label is ",label,".
      absl::string_view label_set = line.substr(name_end, value_start - name_end);
      absl::ConsumePrefix(&label_set, "{");
      absl::ConsumeSuffix(&label_set, "}");
      const std::string delimited = absl::StrCat(",", label_set, ",");
      if (!std::all_of(labels.begin(), labels.end(), [&](const std::string& label) {
            return absl::StrContains(delimited, absl::StrCat(",", label, ","));
          })) {
        continue;
      }
    }
    double value = 0;
    if (!absl::SimpleAtod(line.substr(value_start + 1), &value)) continue;
    sums[std::string(line.substr(0, name_end))] += value;
  }
  return sums;
}

}  // namespace shardtrain::testutil
