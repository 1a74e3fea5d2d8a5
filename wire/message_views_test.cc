// The parsers of message_views.h against stock protobuf: the bytes stock
// protobuf writes, cut into slices anywhere, parse into the view of the
// stock message; hand-made encodings (fields out of order, unknown fields,
// repeated submessages) parse as stock protobuf parses them; malformed
// bytes are INVALID_ARGUMENT.
#include "wire/message_views.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "wire/testing/view_diff.h"
#include "wire/testing/wire_samples.h"

namespace shardtrain::wire {
namespace {

// Stock protobuf logs every invalid UTF-8 string it refuses; these tests
// send many.
google::protobuf::LogHandler* const kQuiet = google::protobuf::SetLogHandler(nullptr);

// Per stock message: its view, parser and error prefix.
template <typename Stock>
struct Traits;

template <>
struct Traits<PushRequest> {
  using View = PushView;
  static absl::Status Parse(const ReceivedMessage& m, View* v) { return ParsePush(m, v); }
  static constexpr const char* kError = "request body is not a valid shardtrain.PushRequest: ";
};
template <>
struct Traits<PushPullRequest> {
  using View = PushPullView;
  static absl::Status Parse(const ReceivedMessage& m, View* v) { return ParsePushPull(m, v); }
  static constexpr const char* kError =
      "request body is not a valid shardtrain.PushPullRequest: ";
};
template <>
struct Traits<PullResponse> {
  using View = PullResponseView;
  static absl::Status Parse(const ReceivedMessage& m, View* v) {
    return ParsePullResponse(m, v);
  }
  static constexpr const char* kError =
      "response body is not a valid shardtrain.PullResponse: ";
};
template <>
struct Traits<PushPullResponse> {
  using View = PushPullResponseView;
  static absl::Status Parse(const ReceivedMessage& m, View* v) {
    return ParsePushPullResponse(m, v);
  }
  static constexpr const char* kError =
      "response body is not a valid shardtrain.PushPullResponse: ";
};

template <typename Stock>
Stock Sample(DType dtype, Encoding encoding, uint32_t seed);
template <>
PushRequest Sample(DType dtype, Encoding encoding, uint32_t seed) {
  return SamplePush(dtype, encoding, seed);
}
template <>
PushPullRequest Sample(DType dtype, Encoding encoding, uint32_t seed) {
  PushPullRequest message;
  *message.mutable_push() = SamplePush(dtype, encoding, seed);
  *message.mutable_pull() = SamplePullRequest(seed);
  return message;
}
template <>
PullResponse Sample(DType dtype, Encoding encoding, uint32_t seed) {
  return SamplePullResponse(dtype, encoding, seed);
}
template <>
PushPullResponse Sample(DType dtype, Encoding encoding, uint32_t seed) {
  PushPullResponse message;
  *message.mutable_push() = SamplePushResponse(seed);
  *message.mutable_pull() = SamplePullResponse(dtype, encoding, seed);
  return message;
}

// Parses `bytes` cut at `cuts` with our parser and with stock protobuf and
// expects the same outcome: both accept with equal views, or both refuse
// (ours with INVALID_ARGUMENT). `stock_may_accept`: bytes ours refuses on
// purpose although stock protobuf takes them (groups).
template <typename Stock>
void ExpectSameAsStock(const std::string& bytes, const std::vector<size_t>& cuts,
                       bool stock_may_accept = false) {
  Stock stock;
  const bool stock_ok = stock.ParseFromString(bytes);
  const ReceivedMessage message = ReceivedMessage::FromPieces(bytes, cuts);
  ASSERT_EQ(message.size(), bytes.size());
  typename Traits<Stock>::View view;
  const absl::Status status = Traits<Stock>::Parse(message, &view);
  const std::string where = absl::StrCat(bytes.size(), " bytes, cuts [",
                                         absl::StrJoin(cuts, ","), "]");
  if (status.ok()) {
    ASSERT_TRUE(stock_ok) << "we accept what stock protobuf refuses: " << where;
    ASSERT_EQ(DiffViews(view, ViewOf(stock)), "") << where;
    return;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), Traits<Stock>::kError)) << status;
  if (!stock_may_accept) {
    ASSERT_FALSE(stock_ok) << "we refuse what stock protobuf accepts: " << status << " "
                           << where;
  }
}

template <typename Stock>
class WireCompat : public ::testing::Test {};
using StockMessages =
    ::testing::Types<PushRequest, PushPullRequest, PullResponse, PushPullResponse>;
TYPED_TEST_SUITE(WireCompat, StockMessages);

constexpr DType kDTypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
constexpr Encoding kEncodings[] = {ENCODING_DENSE, ENCODING_SPARSE};

TYPED_TEST(WireCompat, StockBytesParseCutAnywhere) {
  std::mt19937 rng(7);
  for (DType dtype : kDTypes) {
    for (Encoding encoding : kEncodings) {
      SCOPED_TRACE(absl::StrCat("dtype ", dtype, " encoding ", encoding));
      const TypeParam stock = Sample<TypeParam>(dtype, encoding, dtype * 2 + encoding);
      const std::string bytes = stock.SerializeAsString();
      ASSERT_GT(bytes.size(), 300u);
      // Whole, then every single cut (inside varints, tags, lengths and
      // elements alike).
      for (size_t cut = 0; cut <= bytes.size(); ++cut) {
        ExpectSameAsStock<TypeParam>(bytes, {cut});
        if (::testing::Test::HasFatalFailure()) return;
      }
      // Every byte its own slice.
      std::vector<size_t> all(bytes.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = i;
      ExpectSameAsStock<TypeParam>(bytes, all);
      // Random multi-cuts, some repeated (empty slices).
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<size_t> cuts(1 + rng() % 12);
        for (size_t& cut : cuts) cut = rng() % (bytes.size() + 1);
        std::sort(cuts.begin(), cuts.end());
        ExpectSameAsStock<TypeParam>(bytes, cuts);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TYPED_TEST(WireCompat, EveryTruncationIsRefusedOrAMessagePrefix) {
  // A prefix ending between top-level fields is itself a valid message;
  // any other one is refused, by both.
  const TypeParam stock = Sample<TypeParam>(DTYPE_F16, ENCODING_SPARSE, 3);
  const std::string bytes = stock.SerializeAsString();
  int refused = 0;
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string prefix = bytes.substr(0, length);
    ExpectSameAsStock<TypeParam>(prefix, {length / 2});
    if (::testing::Test::HasFatalFailure()) return;
    TypeParam check;
    refused += check.ParseFromString(prefix) ? 0 : 1;
  }
  EXPECT_GT(refused, static_cast<int>(bytes.size()) / 2);
}

TYPED_TEST(WireCompat, EmptyMessage) {
  ExpectSameAsStock<TypeParam>("", {});
  ExpectSameAsStock<TypeParam>("", {0, 0});
  // A message that is all unknown fields is empty too.
  ExpectSameAsStock<TypeParam>(std::string("\xf8\x01\x05", 3), {1});
}

TYPED_TEST(WireCompat, ReusedViewIsReset) {
  const TypeParam full = Sample<TypeParam>(DTYPE_F32, ENCODING_DENSE, 1);
  typename Traits<TypeParam>::View view;
  const std::string bytes = full.SerializeAsString();
  const ReceivedMessage message = ReceivedMessage::FromPieces(bytes, {});
  ASSERT_TRUE(Traits<TypeParam>::Parse(message, &view).ok());
  // The same view reused for an empty message holds nothing of the first.
  ReceivedMessage empty = ReceivedMessage::FromPieces("", {});
  ASSERT_TRUE(Traits<TypeParam>::Parse(empty, &view).ok());
  EXPECT_EQ(DiffViews(view, ViewOf(TypeParam())), "");
}

// A hand-made protobuf encoding.
class Bytes {
 public:
  Bytes& Varint(uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>(value | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
    return *this;
  }
  Bytes& Tag(uint32_t field, int wire_type) { return Varint(field << 3 | wire_type); }
  Bytes& VarintField(uint32_t field, uint64_t value) { return Tag(field, 0).Varint(value); }
  Bytes& Fixed64Field(uint32_t field, uint64_t value) {
    Tag(field, 1);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(value >> (8 * i)));
    return *this;
  }
  Bytes& Fixed32Field(uint32_t field, uint32_t value) {
    Tag(field, 5);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(value >> (8 * i)));
    return *this;
  }
  Bytes& LengthField(uint32_t field, const std::string& bytes) {
    Tag(field, 2).Varint(bytes.size());
    out_ += bytes;
    return *this;
  }
  Bytes& Raw(const std::string& bytes) {
    out_ += bytes;
    return *this;
  }
  // Unknown fields (numbers the schema lacks) of every wire type but groups.
  Bytes& Unknowns() {
    return VarintField(100, 1ull << 60)
        .Fixed64Field(101, 0x1122334455667788ull)
        .LengthField(102, "unknown \x80 bytes")
        .Fixed32Field(2047, 7);
  }
  const std::string& str() const { return out_; }
  operator std::string() const { return out_; }

 private:
  std::string out_;
};

// Parses `bytes` at a few cuts, expecting agreement with stock protobuf.
template <typename Stock>
void ExpectHandMade(const std::string& bytes, bool expect_ok = true) {
  Stock stock;
  ASSERT_EQ(stock.ParseFromString(bytes), expect_ok);
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    ExpectSameAsStock<Stock>(bytes, {cut});
    if (::testing::Test::HasFatalFailure()) return;
  }
}

std::string Key(const std::string& tensor, uint32_t partition) {
  return Bytes().Unknowns().VarintField(2, partition).LengthField(1, tensor);
}

TEST(WireCompatHandMade, PushFieldsOutOfOrderWithUnknownsEverywhere) {
  const std::string payload = Bytes()
                                  .LengthField(4, std::string("\x01\0\0\0\x05\0\0\0", 8))
                                  .Unknowns()
                                  .LengthField(3, "abcdefgh")
                                  .VarintField(2, ENCODING_SPARSE)
                                  .VarintField(1, DTYPE_F32);
  const std::string part = Bytes()
                               .LengthField(3, payload)
                               .Unknowns()
                               .VarintField(2, static_cast<uint64_t>(-5))
                               .LengthField(1, Key("t", 9));
  const std::string push = Bytes()
                               .VarintField(6, 66)
                               .LengthField(3, part)
                               .Unknowns()
                               .VarintField(5, 55)
                               .VarintField(1, 11)
                               .LengthField(3, part)
                               .VarintField(4, 44)
                               .VarintField(2, 22);
  ExpectHandMade<PushRequest>(push);
  PushView view;
  const ReceivedMessage message = ReceivedMessage::FromPieces(push, {});  // `view` borrows it
  ASSERT_TRUE(ParsePush(message, &view).ok());
  ASSERT_EQ(view.parts.size(), 2u);
  EXPECT_EQ(view.worker, 11u);
  EXPECT_EQ(view.parts[1].key.tensor, "t");
  EXPECT_EQ(view.parts[1].version, -5);
  EXPECT_EQ(view.parts[1].grad.indices.size(), 8u);

  const std::string push_pull = Bytes()
                                    .LengthField(2, SamplePullRequest(1).SerializeAsString())
                                    .Unknowns()
                                    .LengthField(1, push);
  ExpectHandMade<PushPullRequest>(push_pull);
}

TEST(WireCompatHandMade, PullFieldsOutOfOrderWithUnknownsEverywhere) {
  const std::string payload =
      Bytes().LengthField(3, "0123").Unknowns().VarintField(1, DTYPE_BF16);
  const std::string part =
      Bytes().VarintField(2, 9).LengthField(3, payload).Unknowns().LengthField(1, Key("p", 1));
  const std::string pull = Bytes()
                               .VarintField(3, 33)
                               .Fixed64Field(2, 0x3ff8000000000000ull)  // 1.5
                               .Unknowns()
                               .LengthField(1, part)
                               .LengthField(1, part);
  ExpectHandMade<PullResponse>(pull);
  const std::string push_pull = Bytes()
                                    .LengthField(2, pull)
                                    .Unknowns()
                                    .LengthField(1, SamplePushResponse(2).SerializeAsString());
  ExpectHandMade<PushPullResponse>(push_pull);
}

TEST(WireCompatHandMade, KnownFieldsWithAnotherWireTypeAreUnknown) {
  // Stock protobuf skips a known field number sent with the wrong wire type.
  const std::string push = Bytes()
                               .Fixed32Field(1, 5)       // worker as fixed32
                               .LengthField(2, "clock")  // clock as bytes
                               .VarintField(3, 1)        // parts as varint
                               .Fixed64Field(6, 1)
                               .VarintField(1, 8);
  ExpectHandMade<PushRequest>(push);
  const std::string pull = Bytes()
                               .VarintField(2, 1)  // wait_seconds as varint
                               .Fixed32Field(1, 1)
                               .LengthField(3, "x");
  ExpectHandMade<PullResponse>(pull);
  const std::string push_pull = Bytes().VarintField(1, 1).VarintField(2, 2);
  ExpectHandMade<PushPullRequest>(push_pull);
  ExpectHandMade<PushPullResponse>(push_pull);
}

TEST(WireCompatHandMade, RepeatedScalarsAndSubmessagesMerge) {
  // Key twice: the second's tensor wins, the first's partition stays.
  // Payload twice: its data replaced, indices kept from the first, dtype
  // overwritten by the second.
  const std::string first_payload = Bytes()
                                        .VarintField(1, DTYPE_F16)
                                        .VarintField(2, ENCODING_SPARSE)
                                        .LengthField(3, "old data")
                                        .LengthField(4, "old indices");
  const std::string second_payload =
      Bytes().VarintField(1, DTYPE_BF16).LengthField(3, "new").LengthField(3, "newer");
  const std::string part = Bytes()
                               .LengthField(1, Bytes().LengthField(1, "a").VarintField(2, 3))
                               .VarintField(2, 1)
                               .LengthField(3, first_payload)
                               .LengthField(1, Bytes().LengthField(1, "b"))
                               .VarintField(2, 2)
                               .LengthField(3, second_payload);
  const std::string push = Bytes()
                               .VarintField(1, 1)
                               .LengthField(3, part)
                               .VarintField(1, 2)
                               .VarintField(2, 1)
                               .VarintField(2, 0);  // explicitly back to 0
  ExpectHandMade<PushRequest>(push);
  PushView view;
  const ReceivedMessage message = ReceivedMessage::FromPieces(push, {3, 9});
  ASSERT_TRUE(ParsePush(message, &view).ok());
  ASSERT_EQ(view.parts.size(), 1u);
  EXPECT_EQ(view.worker, 2u);
  EXPECT_EQ(view.parts[0].key.tensor, "b");
  EXPECT_EQ(view.parts[0].key.partition, 3u);
  EXPECT_EQ(view.parts[0].grad.data.ToString(), "newer");
  EXPECT_EQ(view.parts[0].grad.indices.ToString(), "old indices");
  EXPECT_EQ(view.parts[0].grad.dtype, DTYPE_BF16);
  EXPECT_EQ(view.parts[0].grad.encoding, ENCODING_SPARSE);

  // A PushPull whose push and pull come twice: parts append, pull merges.
  const std::string push_pull = Bytes()
                                    .LengthField(1, push)
                                    .LengthField(2, SamplePullRequest(1).SerializeAsString())
                                    .LengthField(1, push)
                                    .LengthField(2, SamplePullRequest(2).SerializeAsString());
  ExpectHandMade<PushPullRequest>(push_pull);
  PushPullView push_pull_view;
  const ReceivedMessage push_pull_message = ReceivedMessage::FromPieces(push_pull, {});
  ASSERT_TRUE(ParsePushPull(push_pull_message, &push_pull_view).ok());
  EXPECT_EQ(push_pull_view.push.parts.size(), 2u);
  EXPECT_EQ(push_pull_view.pull.parts_size(), 2 * SamplePullRequest(1).parts_size());

  const std::string pull = Bytes()
                               .Fixed64Field(2, 0x3ff8000000000000ull)
                               .LengthField(1, part)
                               .Fixed64Field(2, 0x8000000000000000ull);  // -0.0
  ExpectHandMade<PullResponse>(pull);
  const std::string response = Bytes()
                                   .LengthField(2, pull)
                                   .LengthField(1, SamplePushResponse(1).SerializeAsString())
                                   .LengthField(2, pull)
                                   .LengthField(1, Bytes().VarintField(3, 0));
  ExpectHandMade<PushPullResponse>(response);
}

TEST(WireCompatHandMade, Int32FieldsKeepTheLow32Bits) {
  const std::string key = Bytes().VarintField(2, 0xffffffff00000007ull);
  const std::string payload = Bytes()
                                  .VarintField(1, static_cast<uint64_t>(-1))
                                  .VarintField(2, 0x100000001ull);
  const std::string part = Bytes().LengthField(1, key).LengthField(3, payload);
  const std::string push = Bytes().VarintField(1, 0x500000003ull).LengthField(3, part);
  ExpectHandMade<PushRequest>(push);
  PushView view;
  const ReceivedMessage message = ReceivedMessage::FromPieces(push, {});  // `view` borrows it
  ASSERT_TRUE(ParsePush(message, &view).ok());
  EXPECT_EQ(view.worker, 3u);
  EXPECT_EQ(view.parts[0].key.partition, 7u);
  EXPECT_EQ(view.parts[0].grad.dtype, -1);
  EXPECT_EQ(view.parts[0].grad.encoding, 1);
}

TEST(WireCompatHandMade, TenByteVarintsDropBitsPast64) {
  // 10 bytes whose last carries more than one bit: protobuf keeps 64 bits.
  const std::string push = Bytes().Tag(2, 0).Raw("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f");
  ExpectHandMade<PushRequest>(push);
  // A padded (non-minimal) varint is fine too.
  ExpectHandMade<PushRequest>(Bytes().Tag(1, 0).Raw(std::string("\x85\x80\x80\x00", 4)));
  // And a padded length and tag.
  ExpectHandMade<PushRequest>(
      Bytes().Raw(std::string("\x9a\x80\x80\x80\x00\x80\x80\x00", 8)));
}

TEST(WireCompatHandMade, ValidUtf8Names) {
  for (const char* name : {"\xf4\x8f\xbf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
                           "\xee\x80\x80", "\xc2\x80", "\x7f", "abcdefghij\xc3\xa9"}) {
    const std::string part = Bytes().LengthField(1, Bytes().LengthField(1, name));
    ExpectHandMade<PushRequest>(Bytes().LengthField(3, part));
  }
}

// Malformed bytes are refused by both parsers, with INVALID_ARGUMENT and a
// reason naming where.
template <typename Stock>
void ExpectRefused(const std::string& bytes, const std::string& reason,
                   bool stock_may_accept = false) {
  SCOPED_TRACE(reason);
  Stock stock;
  if (!stock_may_accept) {
    EXPECT_FALSE(stock.ParseFromString(bytes));
  }
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    typename Traits<Stock>::View view;
    const absl::Status status =
        Traits<Stock>::Parse(ReceivedMessage::FromPieces(bytes, {cut}), &view);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ASSERT_TRUE(absl::StartsWith(status.message(), Traits<Stock>::kError)) << status;
    ASSERT_TRUE(absl::StrContains(status.message(), reason)) << status;
  }
}

TEST(WireMalformed, Varints) {
  ExpectRefused<PushRequest>(Bytes().Tag(2, 0).Raw(std::string(10, '\x80')).Raw("\x01"),
                             "clock: varint longer than 10 bytes at byte 1");
  ExpectRefused<PushRequest>(Bytes().Tag(2, 0).Raw("\x80\x80"), "clock: truncated varint");
  ExpectRefused<PullResponse>(std::string("\x80\x80\x80\x80\x80\x01", 6),
                              "varint longer than 5 bytes");  // a tag
  ExpectRefused<PullResponse>(std::string("\x8a", 1), "truncated varint");
  // A length in 6 bytes (stock protobuf reads at most 5).
  ExpectRefused<PushRequest>(Bytes().Tag(3, 2).Raw(std::string("\x80\x80\x80\x80\x80\x00", 6)),
                             "varint longer than 5 bytes");
}

TEST(WireMalformed, LengthsPastTheEnd) {
  ExpectRefused<PushRequest>(Bytes().Tag(3, 2).Varint(5).Raw("ab"),
                             "parts[0]: length 5 runs past the end of the enclosing "
                             "message (2 bytes left) at byte 1");
  // Past the end of the part, though within the message.
  const std::string part = Bytes().Tag(1, 2).Varint(10);
  ExpectRefused<PushRequest>(Bytes().LengthField(3, part).Raw(std::string(20, 'x')),
                             "parts[0].key: length 10 runs past");
  ExpectRefused<PushPullRequest>(
      Bytes().LengthField(1, Bytes().LengthField(3, Bytes().Tag(3, 2).Varint(100))),
      "push.parts[0].grad: length 100 runs past");
  ExpectRefused<PullResponse>(Bytes().Tag(1, 2).Raw("\xff\xff\xff\xff\x07"),
                              "length 2147483647 over 2 GiB");
  ExpectRefused<PullResponse>(Bytes().Tag(2, 1).Raw("1234567"), "truncated fixed64");
  ExpectRefused<PullResponse>(Bytes().Tag(9, 5).Raw("123"), "truncated field");
  ExpectRefused<PushPullResponse>(Bytes().Tag(1, 2).Varint(3).Raw("\x08"), "push: length 3");
}

TEST(WireMalformed, WireTypes) {
  // Groups: stock protobuf skips unknown ones, we refuse them.
  ExpectRefused<PushRequest>(Bytes().Tag(20, 3).Tag(20, 4), "group (wire type 3) in field 20",
                             /*stock_may_accept=*/true);
  ExpectRefused<PushRequest>(Bytes().Tag(3, 3).Tag(3, 4), "group (wire type 3) in field 3",
                             /*stock_may_accept=*/true);
  ExpectRefused<PullResponse>(Bytes().Tag(7, 4), "end-group tag (wire type 4) in field 7");
  ExpectRefused<PullResponse>(Bytes().Tag(7, 6), "invalid wire type 6 in field 7");
  ExpectRefused<PushPullRequest>(Bytes().Tag(7, 7), "invalid wire type 7 in field 7");
  ExpectRefused<PushPullRequest>(Bytes().Tag(0, 0), "field number 0");
  ExpectRefused<PushPullRequest>(Bytes().LengthField(2, Bytes().Tag(1, 4)),
                                 "pull: not a valid shardtrain.PullRequest");
  ExpectRefused<PushPullResponse>(Bytes().LengthField(1, Bytes().Tag(1, 7)),
                                  "push: not a valid shardtrain.PushResponse");
}

TEST(WireMalformed, InvalidUtf8Names) {
  for (const char* name : {"\xff", "a\x80", "\xc0\xaf", "\xc2", "\xe0\x9f\xbf",
                           "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80",
                           "abcdefgh\xe2\x82"}) {
    const std::string key = Bytes().LengthField(1, name);
    ExpectRefused<PushRequest>(Bytes().LengthField(3, Bytes().LengthField(1, key)),
                               "parts[0].key.tensor: invalid UTF-8");
    ExpectRefused<PullResponse>(Bytes().LengthField(1, Bytes().LengthField(1, key)),
                                "parts[0].key.tensor: invalid UTF-8");
  }
}

TEST(WireLimits, PartsOverTheLimitAreRefusedBeforeParsing) {
  const PushRequest push = SamplePush(DTYPE_F32, ENCODING_DENSE, 1);  // 5 parts
  const std::string bytes = push.SerializeAsString();
  const ReceivedMessage message = ReceivedMessage::FromPieces(bytes, {7, 100});
  PushView view;
  EXPECT_TRUE(ParsePush(message, &view, 5).ok());
  absl::Status status = ParsePush(message, &view, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(status.message(), "push has 5 parts; the limit is 4 per request");

  // 10 million empty parts in 20 MB: refused without allocating for them.
  std::string many;
  for (int i = 0; i < 10'000'000; ++i) many.append("\x1a\x00", 2);
  status = ParsePush(ReceivedMessage::FromPieces(many, {}), &view, 65536);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_LT(view.parts.capacity(), 65536u);

  // In a PushPull, over both occurrences of the push.
  PushPullRequest push_pull;
  *push_pull.mutable_push() = push;
  const std::string twice = push_pull.SerializeAsString() + push_pull.SerializeAsString();
  PushPullView push_pull_view;
  const ReceivedMessage twice_message = ReceivedMessage::FromPieces(twice, {});
  EXPECT_TRUE(ParsePushPull(twice_message, &push_pull_view, 10).ok());
  EXPECT_EQ(push_pull_view.push.parts.size(), 10u);
  status = ParsePushPull(twice_message, &push_pull_view, 9);
  EXPECT_EQ(status.message(), "push has 10 parts; the limit is 9 per request");
}

TEST(ReceivedMessageTest, TakeReferencesTheSlicesAndClears) {
  const std::string big(1000, 'z');
  grpc::Slice slices[] = {grpc::Slice(big), grpc::Slice(std::string("tail"))};
  grpc::ByteBuffer buffer(slices, 2);
  ReceivedMessage message;
  ASSERT_TRUE(message.Take(&buffer).ok());
  EXPECT_EQ(message.size(), 1004u);
  ASSERT_EQ(message.slices().size(), 2u);
  // The large slice is referenced, not copied.
  EXPECT_EQ(message.slices()[0].begin(), slices[0].begin());
  EXPECT_EQ(buffer.Length(), 0u);

  grpc::ByteBuffer never_filled;
  ASSERT_TRUE(message.Take(&never_filled).ok());
  EXPECT_EQ(message.size(), 0u);
}

TEST(ReceivedMessageTest, RangeReferencesTheSlicesItSpans) {
  const std::string first(100, 'a');
  const std::string second = "bcdef";
  grpc::Slice slices[] = {grpc::Slice(first), grpc::Slice(second)};
  grpc::ByteBuffer buffer(slices, 2);
  ReceivedMessage message;
  ASSERT_TRUE(message.Take(buffer).ok());
  const auto bytes_of = [](const grpc::ByteBuffer& range) {
    std::vector<grpc::Slice> pieces;
    std::string out;
    if (range.Valid()) {
      EXPECT_TRUE(range.Dump(&pieces).ok());
    }
    for (const grpc::Slice& piece : pieces) {
      out.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
    return out;
  };
  EXPECT_EQ(bytes_of(message.Range(98, 4)), "aabc");
  EXPECT_EQ(bytes_of(message.Range(0, 105)), first + second);
  EXPECT_EQ(bytes_of(message.Range(101, 3)), "cde");
  EXPECT_EQ(bytes_of(message.Range(10, 0)), "");
  // Within the first slice: a view of its bytes, not a copy (gRPC copies
  // only pieces short enough to keep inside the slice itself).
  std::vector<grpc::Slice> pieces;
  ASSERT_TRUE(message.Range(10, 80).Dump(&pieces).ok());
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].begin(), message.slices()[0].begin() + 10);
}

// A replicated head forwards the push half of a PushPull as it arrived:
// the view says where it lies, cut anywhere.
TEST(WireCompatHandMade, PushPullViewLocatesItsPushHalf) {
  const PushPullRequest stock = Sample<PushPullRequest>(DTYPE_F32, ENCODING_DENSE, 3);
  const std::string bytes = stock.SerializeAsString();
  const std::string push = stock.push().SerializeAsString();
  for (size_t cut = 0; cut <= bytes.size(); cut += 7) {
    const ReceivedMessage message = ReceivedMessage::FromPieces(bytes, {cut});
    PushPullView view;
    ASSERT_TRUE(ParsePushPull(message, &view).ok());
    EXPECT_EQ(view.push_fields, 1);
    ASSERT_EQ(view.push_size, push.size());
    grpc::ByteBuffer range = message.Range(view.push_offset, view.push_size);
    std::vector<grpc::Slice> pieces;
    ASSERT_TRUE(range.Dump(&pieces).ok());
    std::string got;
    for (const grpc::Slice& piece : pieces) {
      got.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
    EXPECT_EQ(got, push) << "cut at " << cut;
  }
  // Two push fields (merged by protobuf's rules) are counted.
  const std::string twice = bytes + stock.SerializeAsString();
  PushPullView view;
  ASSERT_TRUE(ParsePushPull(ReceivedMessage::FromPieces(twice, {}), &view).ok());
  EXPECT_EQ(view.push_fields, 2);
}

}  // namespace
}  // namespace shardtrain::wire
