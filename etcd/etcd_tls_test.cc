// TLS to etcd: a real etcd serving https with --client-cert-auth
// (certificates from scripts/make-certs.sh, made twice: this cluster's and
// a stranger's). Only a client holding a certificate of the cluster's CA
// can use it; every other client is refused at connect, with a message
// that says what to check (MakeEtcdCredentials, common/credentials.h).
// Skips without etcd or openssl.
#include "common/credentials.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "etcd/etcd_client.h"
#include "testing/etcd_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

using ::shardtrain::etcd::EtcdClient;
using ::shardtrain::testutil::EtcdProcess;
using ::testing::HasSubstr;

class EtcdTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!EtcdProcess::Available() || std::system("command -v openssl >/dev/null") != 0) return;
    std::string pattern =
        (std::filesystem::temp_directory_path() / "shardtrain_etcd_tls_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    for (const char* which : {"cluster", "stranger"}) {
      const std::string command = absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh ",
                                               *dir_, "/", which, " >/dev/null");
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
    EtcdProcess::Tls tls{File("cluster", "server.pem"), File("cluster", "server.key"),
                         File("cluster", "ca.pem")};
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("127.0.0.1", tls);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = etcd->release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);  // private keys
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (etcd_ == nullptr) GTEST_SKIP() << "needs etcd (etcd-server) and openssl";
  }

  static std::string File(const std::string& which, const std::string& name) {
    return absl::StrCat(*dir_, "/", which, "/", name);
  }
  static ClientSecurity Client(const std::string& which) {
    ClientSecurity security;
    security.ca_file = File("cluster", "ca.pem");
    security.cert_file = File(which, "client.pem");
    security.key_file = File(which, "client.key");
    return security;
  }
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const ClientSecurity& security) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeEtcdCredentials(security);
    if (!credentials.ok()) return credentials.status();
    EtcdClient::Options options;
    options.endpoints = etcd_->endpoint();
    options.credentials = *credentials;
    options.connect_timeout = absl::Seconds(2);
    return EtcdClient::Create(options);
  }

  static std::string* dir_;
  static EtcdProcess* etcd_;
};

std::string* EtcdTlsTest::dir_ = nullptr;
EtcdProcess* EtcdTlsTest::etcd_ = nullptr;

TEST_F(EtcdTlsTest, AClientWithTheClustersCertificateReadsWritesLeasesAndWatches) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client, Connect(Client("cluster")));
  absl::Notification seen;
  auto watcher = client->Watch("/tls/", 0, [&seen](const etcd::WatchEvent& event) {
    if (event.key == "/tls/k" && !seen.HasBeenNotified()) seen.Notify();
  });
  ASSERT_OK_AND_ASSIGN(etcd::Lease lease, client->GrantLease(absl::Seconds(5)));
  ASSERT_OK(client->Put("/tls/k", "v", lease.id).status());
  ASSERT_OK_AND_ASSIGN(etcd::KeyValue kv, client->Get("/tls/k"));
  EXPECT_EQ(kv.value, "v");
  EXPECT_TRUE(seen.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(EtcdTlsTest, AClientWithoutACertificateIsRefused) {
  ClientSecurity security;
  security.ca_file = File("cluster", "ca.pem");
  const absl::Status status = Connect(security).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("over TLS"));
}

TEST_F(EtcdTlsTest, AStrangersCertificateIsRefused) {
  const absl::Status status = Connect(Client("stranger")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST_F(EtcdTlsTest, APlaintextClientIsRefusedAndToldToGiveACa) {
  const absl::Status status = Connect(ClientSecurity{}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("--etcd_ca"));
}

TEST(MakeEtcdCredentialsTest, AllEmptyIsPlaintext) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                       MakeEtcdCredentials(ClientSecurity{}));
  EXPECT_EQ(credentials, nullptr);
}

TEST(MakeEtcdCredentialsTest, InconsistentFlagsAreNamed) {
  ClientSecurity no_ca;
  no_ca.cert_file = "client.pem";
  no_ca.key_file = "client.key";
  EXPECT_THAT(MakeEtcdCredentials(no_ca).status().message(), HasSubstr("--etcd_ca"));
  EXPECT_EQ(MakeEtcdCredentials(no_ca).status().code(), absl::StatusCode::kInvalidArgument);
  ClientSecurity no_key;
  no_key.ca_file = "ca.pem";
  no_key.cert_file = "client.pem";
  EXPECT_THAT(MakeEtcdCredentials(no_key).status().message(),
              HasSubstr("--etcd_cert and --etcd_key"));
  ClientSecurity missing;
  missing.ca_file = "/nonexistent/ca.pem";
  const absl::Status status = MakeEtcdCredentials(missing).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("etcd TLS"));
}

}  // namespace
}  // namespace shardtrain::common
