// A protobuf message as a Python dict, every field included (proto3
// defaults too): scalars as int/float/bool/str, bytes as bytes, enums by
// name, repeated fields as lists, messages as dicts. Used for the
// heartbeat and status answers, so a new field shows up without a binding
// change. Call with the GIL held.
//
//   py::dict status = MessageToDict(status_response);
//   status["workers"][0]["clock"]
#ifndef SHARDTRAIN_PYTHON_SRC_PROTO_DICT_H_
#define SHARDTRAIN_PYTHON_SRC_PROTO_DICT_H_

#include <google/protobuf/message.h>
#include <pybind11/pybind11.h>

namespace shardtrain::python {

pybind11::dict MessageToDict(const google::protobuf::Message& message);

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_PROTO_DICT_H_
