#include "common/credentials.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

absl::StatusCode ServerCode(const ServerSecurity& security) {
  return MakeServerCredentials(security, nullptr).status().code();
}

absl::StatusCode ClientCode(const ClientSecurity& security) {
  return MakeChannelCredentials(security, nullptr).status().code();
}

TEST(CredentialsTest, NothingSetIsPlaintext) {
  EXPECT_TRUE(MakeServerCredentials(ServerSecurity(), nullptr).ok());
  EXPECT_TRUE(MakeChannelCredentials(ClientSecurity(), nullptr).ok());
}

TEST(CredentialsTest, InconsistentServerSettingsAreRejected) {
  ServerSecurity token_without_tls;
  token_without_tls.token_file = "token";
  EXPECT_EQ(ServerCode(token_without_tls), kInvalid);
  ServerSecurity client_ca_without_tls;
  client_ca_without_tls.client_ca_file = "ca.pem";
  EXPECT_EQ(ServerCode(client_ca_without_tls), kInvalid);
  ServerSecurity key_without_cert;
  key_without_cert.key_file = "server.key";
  EXPECT_EQ(ServerCode(key_without_cert), kInvalid);
  ServerSecurity missing_files;
  missing_files.cert_file = "/nonexistent/server.pem";
  missing_files.key_file = "/nonexistent/server.key";
  EXPECT_EQ(ServerCode(missing_files), absl::StatusCode::kNotFound);
}

TEST(CredentialsTest, InconsistentClientSettingsAreRejected) {
  ClientSecurity token_without_tls;
  token_without_tls.token_file = "token";
  EXPECT_EQ(ClientCode(token_without_tls), kInvalid);
  ClientSecurity cert_without_ca;
  cert_without_ca.cert_file = "client.pem";
  cert_without_ca.key_file = "client.key";
  EXPECT_EQ(ClientCode(cert_without_ca), kInvalid);
  ClientSecurity name_without_tls;
  name_without_tls.server_name = "shard-0";
  EXPECT_EQ(ClientCode(name_without_tls), kInvalid);
  ClientSecurity missing_ca;
  missing_ca.ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(ClientCode(missing_ca), absl::StatusCode::kNotFound);
}

TEST(CredentialsTest, TokensMustBePrintableAndNonEmpty) {
  char dir_template[] = "/tmp/shardtrain-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/token";
  auto client_with_token = [&](const std::string& token) {
    std::ofstream(path) << token;
    ClientSecurity security;
    security.ca_file = path;  // Readable; its contents are not checked here.
    security.token_file = path;
    return ClientCode(security);
  };
  EXPECT_EQ(client_with_token(""), kInvalid);
  EXPECT_EQ(client_with_token("  \n"), kInvalid);
  EXPECT_EQ(client_with_token("two words"), kInvalid);
  EXPECT_EQ(client_with_token("caf\xc3\xa9"), kInvalid);
  EXPECT_EQ(client_with_token("0123abcd\n"), absl::StatusCode::kOk);  // Newline stripped.

  // The same rules for a token given as a value.
  auto client_with_value = [&](const std::string& token) {
    ClientSecurity security;
    security.ca_file = path;
    security.token = token;
    return ClientCode(security);
  };
  EXPECT_EQ(client_with_value("  \n"), kInvalid);
  EXPECT_EQ(client_with_value("two words"), kInvalid);
  EXPECT_EQ(client_with_value("0123abcd"), absl::StatusCode::kOk);
  ClientSecurity both;
  both.ca_file = path;
  both.token_file = path;
  both.token = "0123abcd";
  EXPECT_EQ(ClientCode(both), kInvalid);
  ClientSecurity value_without_tls;
  value_without_tls.token = "0123abcd";
  EXPECT_EQ(ClientCode(value_without_tls), kInvalid);
  std::remove(path.c_str());
  rmdir(dir_template);
}

}  // namespace
}  // namespace shardtrain::common
