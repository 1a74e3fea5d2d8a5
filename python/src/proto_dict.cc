#include "python/src/proto_dict.h"

#include <string>

namespace shardtrain::python {
namespace py = pybind11;

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

py::object Single(const Message& message, const FieldDescriptor* field) {
  const Reflection* r = message.GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(r->GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(r->GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(r->GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(r->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(r->GetDouble(message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(r->GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(r->GetBool(message, field));
    case FieldDescriptor::CPPTYPE_ENUM:
      return py::str(r->GetEnum(message, field)->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value = r->GetString(message, field);
      if (field->type() == FieldDescriptor::TYPE_BYTES) return py::bytes(value);
      return py::str(value);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(r->GetMessage(message, field));
  }
  return py::none();
}

py::object Element(const Message& message, const FieldDescriptor* field, int i) {
  const Reflection* r = message.GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(r->GetRepeatedInt32(message, field, i));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(r->GetRepeatedInt64(message, field, i));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(r->GetRepeatedUInt32(message, field, i));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(r->GetRepeatedUInt64(message, field, i));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(r->GetRepeatedDouble(message, field, i));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(r->GetRepeatedFloat(message, field, i));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(r->GetRepeatedBool(message, field, i));
    case FieldDescriptor::CPPTYPE_ENUM:
      return py::str(r->GetRepeatedEnum(message, field, i)->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value = r->GetRepeatedString(message, field, i);
      if (field->type() == FieldDescriptor::TYPE_BYTES) return py::bytes(value);
      return py::str(value);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(r->GetRepeatedMessage(message, field, i));
  }
  return py::none();
}

}  // namespace

py::dict MessageToDict(const Message& message) {
  py::dict out;
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int f = 0; f < descriptor->field_count(); ++f) {
    const FieldDescriptor* field = descriptor->field(f);
    if (field->is_repeated()) {
      py::list list;
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        list.append(Element(message, field, i));
      }
      out[py::str(field->name())] = std::move(list);
    } else {
      out[py::str(field->name())] = Single(message, field);
    }
  }
  return out;
}

}  // namespace shardtrain::python
