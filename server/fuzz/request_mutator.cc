#include "server/fuzz/request_mutator.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "proto/shardtrain.pb.h"
#include "server/fuzz/fuzz_input.h"

namespace shardtrain::server::fuzz {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

struct Record {
  uint8_t op = 0;
  std::string bytes;
};

std::unique_ptr<Message> NewRequest(uint8_t op) {
  switch (static_cast<Op>(op % kNumOps)) {
    case Op::kRegister:
      return std::make_unique<RegisterRequest>();
    case Op::kPush:
      return std::make_unique<PushRequest>();
    case Op::kPull:
      return std::make_unique<PullRequest>();
    case Op::kPushPull:
      return std::make_unique<PushPullRequest>();
    case Op::kHeartbeat:
      return std::make_unique<HeartbeatRequest>();
    case Op::kStatus:
      return std::make_unique<StatusRequest>();
    case Op::kTick:
      return nullptr;
    case Op::kRegisterTables:
      return std::make_unique<RegisterTablesRequest>();
    case Op::kLookup:
      return std::make_unique<LookupRequest>();
    case Op::kPushSparse:
      return std::make_unique<PushSparseRequest>();
    case Op::kApplySparseOp:
      return std::make_unique<SparseOp>();
  }
  return nullptr;
}

// A field of a message in the tree: one element (index >= 0) or the field
// itself (index -1: a singular field, or a repeated one as a whole).
struct FieldRef {
  Message* message;
  const FieldDescriptor* field;
  int index;
};

void Collect(Message* message, std::vector<FieldRef>* out) {
  const Reflection* reflection = message->GetReflection();
  const google::protobuf::Descriptor* descriptor = message->GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_repeated()) {
      out->push_back({message, field, -1});
      const int size = reflection->FieldSize(*message, field);
      for (int j = 0; j < size; ++j) {
        if (is_message) {
          Collect(reflection->MutableRepeatedMessage(message, field, j), out);
        } else {
          out->push_back({message, field, j});
        }
      }
    } else if (is_message && reflection->HasField(*message, field)) {
      Collect(reflection->MutableMessage(message, field), out);
    } else {
      out->push_back({message, field, -1});
    }
  }
}

template <typename T>
T Pick(std::minstd_rand& rng, std::initializer_list<T> values) {
  return values.begin()[rng() % values.size()];
}

int64_t EdgeInt64(std::minstd_rand& rng) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return Pick<int64_t>(rng, {0, 1, 2, 3, -1, kMax, kMax - 1, std::numeric_limits<int64_t>::min(),
                             int64_t{1} << 14, (int64_t{1} << 14) + 1, int64_t{1} << 16,
                             int64_t{1} << 30, int64_t{1} << 31, int64_t{1} << 32,
                             int64_t{1} << 40, (int64_t{1} << 40) + 1, int64_t{1} << 62,
                             static_cast<int64_t>(rng() % 64)});
}

uint64_t EdgeUint64(std::minstd_rand& rng) {
  return Pick<uint64_t>(rng, {0, 1, 2, 3, ~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 32,
                              0x5eed0000, 0x5eed0001, rng() % 8});
}

float EdgeFloat(std::minstd_rand& rng) {
  return Pick<float>(rng, {0.0f, -0.0f, 1.0f, -1.0f, std::nanf(""),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(), 65504.0f, 1e-30f});
}

std::string EdgeString(std::minstd_rand& rng, const FieldDescriptor* field,
                       const std::string& current) {
  if (field->type() == FieldDescriptor::TYPE_STRING) {
    return Pick<std::string>(rng, {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias", "t0",
                                   "w", "", std::string(257, 'n')});
  }
  // Bytes (payload data and indices): a little longer or shorter, or empty.
  std::string bytes = current;
  switch (rng() % 4) {
    case 0:
      bytes.clear();
      break;
    case 1:
      bytes.resize(bytes.size() - std::min<size_t>(bytes.size(), 1 + rng() % 4));
      break;
    case 2:
      bytes.append(1 + rng() % 4, static_cast<char>(rng()));
      break;
    default: {
      // A value or index set to all ones (a huge index, a NaN).
      if (!bytes.empty()) {
        const size_t at = (rng() % bytes.size()) & ~size_t{3};
        for (size_t i = at; i < std::min(at + 4, bytes.size()); ++i) bytes[i] = '\xff';
      }
      break;
    }
  }
  return bytes;
}

// Sets one scalar (an element when ref.index >= 0) to an edge value.
void MutateScalar(const FieldRef& ref, std::minstd_rand& rng) {
  Message* m = ref.message;
  const FieldDescriptor* f = ref.field;
  const Reflection* r = m->GetReflection();
  const bool element = ref.index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = EdgeInt64(rng);
      element ? r->SetRepeatedInt64(m, f, ref.index, v) : r->SetInt64(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      const auto v = static_cast<int32_t>(EdgeInt64(rng));
      element ? r->SetRepeatedInt32(m, f, ref.index, v) : r->SetInt32(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = EdgeUint64(rng);
      element ? r->SetRepeatedUInt64(m, f, ref.index, v) : r->SetUInt64(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const auto v = static_cast<uint32_t>(
          Pick<uint64_t>(rng, {0, 1, 2, 3, 4, 5, 8, 4096, 0x7fffffff, 0xffffffff}));
      element ? r->SetRepeatedUInt32(m, f, ref.index, v) : r->SetUInt32(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = EdgeFloat(rng);
      element ? r->SetRepeatedFloat(m, f, ref.index, v) : r->SetFloat(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = EdgeFloat(rng);
      element ? r->SetRepeatedDouble(m, f, ref.index, v) : r->SetDouble(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = element ? !r->GetRepeatedBool(*m, f, ref.index) : !r->GetBool(*m, f);
      element ? r->SetRepeatedBool(m, f, ref.index, v) : r->SetBool(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // proto3 enums are open: unknown numbers reach the shard too.
      const int v = static_cast<int>(rng() % 6) - 1;
      element ? r->SetRepeatedEnumValue(m, f, ref.index, v) : r->SetEnumValue(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string current =
          element ? r->GetRepeatedString(*m, f, ref.index) : r->GetString(*m, f);
      const std::string v = EdgeString(rng, f, current);
      element ? r->SetRepeatedString(m, f, ref.index, v) : r->SetString(m, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      r->MutableMessage(m, f);  // an absent submessage, now present and empty
      break;
  }
}

// Adds a copy of an element (or a new one) to a repeated field, or removes
// its last element.
void MutateRepeated(const FieldRef& ref, std::minstd_rand& rng) {
  Message* m = ref.message;
  const FieldDescriptor* f = ref.field;
  const Reflection* r = m->GetReflection();
  const int size = r->FieldSize(*m, f);
  if (size > 0 && rng() % 3 == 0) {
    r->RemoveLast(m, f);
    return;
  }
  const int from = size > 0 ? static_cast<int>(rng() % size) : -1;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      Message* added = r->AddMessage(m, f);
      if (from >= 0) added->CopyFrom(r->GetRepeatedMessage(*m, f, from));
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64:
      r->AddInt64(m, f, from >= 0 ? r->GetRepeatedInt64(*m, f, from) : EdgeInt64(rng));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      r->AddString(m, f, from >= 0 ? r->GetRepeatedString(*m, f, from) : std::string());
      break;
    default:
      break;  // the protocol has no other repeated scalars
  }
}

}  // namespace

size_t MutateRequests(uint8_t* data, size_t size, size_t max_size, std::minstd_rand& rng) {
  if (size < kHeaderBytes) return 0;
  std::vector<Record> records;
  size_t at = kHeaderBytes;
  while (records.size() < static_cast<size_t>(kMaxOps) && at + 3 <= size) {
    const size_t length = data[at + 1] | (static_cast<size_t>(data[at + 2]) << 8);
    if (length > size - at - 3) break;
    records.push_back({data[at], std::string(reinterpret_cast<const char*>(data + at + 3), length)});
    at += 3 + length;
  }
  if (records.empty()) return 0;

  const size_t pick = rng() % records.size();
  switch (rng() % 8) {
    case 0:  // repeat a request (a retry, or the next step)
      if (records.size() < static_cast<size_t>(kMaxOps)) {
        records.insert(records.begin() + static_cast<std::ptrdiff_t>(rng() % records.size()),
                       records[pick]);
      }
      break;
    case 1:  // drop one
      if (records.size() > 1) records.erase(records.begin() + static_cast<std::ptrdiff_t>(pick));
      break;
    default: {  // change one field of one request
      std::unique_ptr<Message> request = NewRequest(records[pick].op);
      if (request == nullptr || !request->ParseFromString(records[pick].bytes)) return 0;
      std::vector<FieldRef> fields;
      Collect(request.get(), &fields);
      if (fields.empty()) return 0;
      const FieldRef& ref = fields[rng() % fields.size()];
      if (ref.field->is_repeated() && ref.index < 0) {
        MutateRepeated(ref, rng);
      } else {
        MutateScalar(ref, rng);
      }
      if (!request->SerializeToString(&records[pick].bytes)) return 0;
      break;
    }
  }

  std::string out(reinterpret_cast<const char*>(data), kHeaderBytes);
  for (const Record& record : records) {
    if (record.bytes.size() > 0xffff) return 0;
    AppendOp(static_cast<Op>(record.op), record.bytes, &out);
  }
  if (out.size() > max_size) return 0;
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace shardtrain::server::fuzz
