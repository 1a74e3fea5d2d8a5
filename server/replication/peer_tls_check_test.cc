// CheckPeerTls against a real TLS shard, with certificates from
// scripts/make-certs.sh: a shard certificate that may also authenticate as
// a client passes; one that names another host, or one only for servers
// (as make-certs.sh made them before replication), fails with what to fix.
#include "server/replication/peer_tls_check.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

class PeerTlsCheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "/peer-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    const std::string make = absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh ",
                                          *dir_, " >/dev/null");
    ASSERT_EQ(std::system(make.c_str()), 0) << make;
    // A shard certificate for servers only, signed by the same CA.
    const std::string server_only = absl::StrCat(
        "cd ", *dir_, " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n",
        "extendedKeyUsage=serverAuth\\n' >only.ext && openssl req -newkey ec -pkeyopt ",
        "ec_paramgen_curve:prime256v1 -nodes -keyout only.key -out only.csr -subj /CN=only ",
        "2>/dev/null && openssl x509 -req -in only.csr -CA ca.pem -CAkey ca.key ",
        "-CAcreateserial -out only.pem -days 1 -extfile only.ext 2>/dev/null");
    ASSERT_EQ(std::system(server_only.c_str()), 0) << server_only;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  // Starts an unreplicated TLS shard with certificate `cert`.
  void Start(const std::string& cert) {
    PsServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.security.cert_file = File(cert + ".pem");
    options.security.key_file = File(cert + ".key");
    options.security.client_ca_file = File("ca.pem");
    options.security.token_file = File("token");
    absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // What a shard with certificate `cert` forwards with.
  static common::ClientSecurity Peer(const std::string& cert) {
    common::ClientSecurity peer;
    peer.ca_file = File("ca.pem");
    peer.cert_file = File(cert + ".pem");
    peer.key_file = File(cert + ".key");
    peer.token_file = File("token");
    return peer;
  }

  std::string Local() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  static std::string* dir_;
  std::unique_ptr<PsServer> server_;
};

std::string* PeerTlsCheckTest::dir_ = nullptr;

TEST_F(PeerTlsCheckTest, MakeCertsShardCertificatePasses) {
  Start("server");
  EXPECT_OK(CheckPeerTls(Peer("server"), Local(), absl::StrCat("localhost:", server_->port()),
                         absl::Seconds(10)));
  EXPECT_OK(CheckPeerTls(Peer("server"), Local(), Local(), absl::Seconds(10)));
}

TEST_F(PeerTlsCheckTest, AdvertisedNameNotInTheCertificateFails) {
  Start("server");
  const absl::Status status =
      CheckPeerTls(Peer("server"), Local(), "shard-7.elsewhere:7000", absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("must name shard-7.elsewhere"));
}

TEST_F(PeerTlsCheckTest, ServerOnlyCertificateFailsNamingClientAuth) {
  Start("only");
  const absl::Status status =
      CheckPeerTls(Peer("only"), Local(), Local(), absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("clientAuth"));
}

}  // namespace
}  // namespace shardtrain::server
