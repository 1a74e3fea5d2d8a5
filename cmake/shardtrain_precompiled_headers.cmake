# Precompiled headers: most of a build's time goes to parsing the same
# library headers (gRPC, protobuf, Abseil, prometheus-cpp, glog, and
# GoogleTest in the tests) in every file, 2-5 s of each file's 5-18 s on the
# 2-core VM. With GCC or clang, one precompiled header of them is built per
# kind of target and shared by every target of that kind:
#   - tests: each GoogleTest binary (shardtrain_add_test calls
#     shardtrain_test_build_speed, which also compiles its sources at -O1);
#   - libraries (position-independent) and the other executables (PIE):
#     shardtrain_precompile_headers(), called once at the end of the
#     top-level CMakeLists.txt, walks every directory's targets.
# The project's own headers are parsed with each file as before, and the
# sources still include what they use. A kind is split where its files'
# options differ in a way a compiler checks (-fno-math-errno; -pthread is
# given to every file): GCC would ignore a mismatched header (-Winvalid-pch
# says so) and clang refuse it. CMAKE_DISABLE_PRECOMPILE_HEADERS=ON builds
# without; the lock check does, scripts/syntax-check.py has its own.

set(SHARDTRAIN_PCH_HEADERS
  <grpcpp/grpcpp.h> <google/protobuf/message.h> <google/protobuf/arena.h>
  <google/protobuf/generated_message_reflection.h> <google/protobuf/repeated_field.h>
  <prometheus/registry.h> <prometheus/counter.h> <prometheus/gauge.h>
  <prometheus/histogram.h> <glog/logging.h>
  [["absl/status/status.h"]] [["absl/status/statusor.h"]] [["absl/strings/str_cat.h"]]
  [["absl/strings/str_format.h"]] [["absl/synchronization/mutex.h"]]
  [["absl/container/flat_hash_map.h"]] [["absl/time/time.h"]] [["absl/time/clock.h"]]
  <algorithm> <cmath> <map> <memory> <random> <string> <thread> <vector>)
set(SHARDTRAIN_TEST_PCH_HEADERS <gtest/gtest.h> <gmock/gmock.h> ${SHARDTRAIN_PCH_HEADERS})

if(CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$" AND NOT CMAKE_DISABLE_PRECOMPILE_HEADERS)
  set(SHARDTRAIN_USE_PCH ON)
  # Every file is compiled with -pthread, as gRPC's and Abseil's users are:
  # a precompiled header built with it (it defines _REENTRANT) is refused by
  # a file without it.
  add_compile_options(-pthread)
else()
  set(SHARDTRAIN_USE_PCH OFF)
endif()

# shardtrain_share_pch(TARGET KIND HEADERS...): TARGET builds the precompiled
# header of KIND if no target has yet, and reuses it otherwise.
function(shardtrain_share_pch name kind)
  if(NOT SHARDTRAIN_USE_PCH)
    return()
  endif()
  get_property(owner GLOBAL PROPERTY SHARDTRAIN_PCH_OWNER_${kind})
  if(owner)
    target_precompile_headers(${name} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${name} PRIVATE ${ARGN})
    set_property(GLOBAL PROPERTY SHARDTRAIN_PCH_OWNER_${kind} ${name})
  endif()
endfunction()

# shardtrain_test_build_speed(TARGET): a GoogleTest binary's own sources. In
# optimized builds they are compiled at -O1, which halves their code
# generation: they drive the libraries, which keep the build type's flags
# (-O3 in Release).
function(shardtrain_test_build_speed name)
  target_compile_options(${name} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,RelWithDebInfo,MinSizeRel>>:-O1>)
  shardtrain_share_pch(${name} test ${SHARDTRAIN_TEST_PCH_HEADERS})
endfunction()

# shardtrain_targets_below(VAR DIR): the targets defined in DIR and below.
function(shardtrain_targets_below var dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir ${subdirs})
    shardtrain_targets_below(below ${subdir})
    list(APPEND targets ${below})
  endforeach()
  set(${var} ${targets} PARENT_SCOPE)
endfunction()

# shardtrain_precompile_headers(): every static or object library and every
# executable with C++ sources that has no precompiled header yet (the tests
# have theirs) shares one per kind. Not the Python extension (a module
# library, compiled with pybind11's hidden visibility), and not targets with
# sources other than C++ (the CUDA backend's kernels).
function(shardtrain_precompile_headers)
  if(NOT SHARDTRAIN_USE_PCH)
    return()
  endif()
  shardtrain_targets_below(targets ${PROJECT_SOURCE_DIR})
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set(kind executable)
    elseif(type STREQUAL "STATIC_LIBRARY" OR type STREQUAL "OBJECT_LIBRARY")
      set(kind library)
    else()
      continue()
    endif()
    get_target_property(own ${target} PRECOMPILE_HEADERS)
    get_target_property(reused ${target} PRECOMPILE_HEADERS_REUSE_FROM)
    get_target_property(sources ${target} SOURCES)
    if(own OR reused OR NOT sources)
      continue()
    endif()
    set(cxx OFF)
    set(other OFF)
    foreach(source ${sources})
      if(source MATCHES "\\.(cc|cpp)$")
        set(cxx ON)
      elseif(source MATCHES "\\.(c|cu)$")
        set(other ON)
      endif()
    endforeach()
    # A header built without -fno-math-errno is refused by a file with it
    # (the server's and the tables' libraries).
    get_target_property(options ${target} COMPILE_OPTIONS)
    if(options AND "-fno-math-errno" IN_LIST options)
      string(APPEND kind _no_math_errno)
    endif()
    if(cxx AND NOT other)
      shardtrain_share_pch(${target} ${kind} ${SHARDTRAIN_PCH_HEADERS})
    endif()
  endforeach()
endfunction()
