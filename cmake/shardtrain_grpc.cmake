# shardtrain_grpc_library(NAME PROTOS a.proto [b.proto ...])
# Generates C++ messages and gRPC stubs for the given .proto files (in the
# calling directory) into ${CMAKE_BINARY_DIR}/<dir> and builds them as
# library NAME, includable as "<dir>/<file>.pb.h" (and installed so when a
# public header includes them; cmake/shardtrain_install.cmake). Target
# NAME_sources only generates them.
function(shardtrain_grpc_library name)
  cmake_parse_arguments(ARG "" "" "PROTOS" ${ARGN})
  file(RELATIVE_PATH rel_dir ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(gen_dir ${CMAKE_BINARY_DIR}/${rel_dir})
  get_target_property(grpc_cpp_plugin gRPC::grpc_cpp_plugin LOCATION)
  set(srcs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(base ${proto} NAME_WE)
    set(outputs ${gen_dir}/${base}.pb.cc ${gen_dir}/${base}.pb.h
                ${gen_dir}/${base}.grpc.pb.cc ${gen_dir}/${base}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outputs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${gen_dir}
      COMMAND protobuf::protoc
              --proto_path=${CMAKE_CURRENT_SOURCE_DIR}
              --cpp_out=${gen_dir}
              --grpc_out=${gen_dir}
              --plugin=protoc-gen-grpc=${grpc_cpp_plugin}
              ${CMAKE_CURRENT_SOURCE_DIR}/${proto}
      DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${proto}
      COMMENT "Generating C++ and gRPC sources for ${proto}")
    list(APPEND srcs ${gen_dir}/${base}.pb.cc ${gen_dir}/${base}.grpc.pb.cc)
  endforeach()
  # The generated sources alone (scripts/check-thread-safety.sh needs the
  # headers, not the library); the library waits for them, so a parallel
  # build runs protoc once.
  add_custom_target(${name}_sources DEPENDS ${srcs})
  add_library(${name} ${srcs})
  add_dependencies(${name} ${name}_sources)
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}>)
  set(headers)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(base ${proto} NAME_WE)
    list(APPEND headers ${rel_dir}/${base}.pb.h ${rel_dir}/${base}.grpc.pb.h)
  endforeach()
  shardtrain_generated_headers(${name} ${headers})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf gRPC::grpc++)
  target_compile_options(${name} PRIVATE -w)
endfunction()
