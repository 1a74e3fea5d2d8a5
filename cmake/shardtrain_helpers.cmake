# shardtrain_add_test(NAME SOURCES a.cc [b.cc] LIBS lib... [LABELS l...]
#                     [TIMEOUT s] [PROCESSES] [SOURCE_TREE] [OWN_MAIN])
# Adds one GoogleTest binary and registers each test case with ctest.
# PROCESSES: the test starts the real binaries: it gets SHARDTRAIN_BIN_DIR,
# SHARDTRAIN_BUILD_DIR and SHARDTRAIN_SOURCE_DIR, is built after ps-server
# and ps-worker, and runs alone (RUN_SERIAL: its timings must not compete
# with other tests). SOURCE_TREE: the test runs files of the source tree
# (scripts/make-certs.sh): it gets SHARDTRAIN_SOURCE_DIR. OWN_MAIN: the
# sources define main().
function(shardtrain_add_test name)
  if(NOT SHARDTRAIN_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "PROCESSES;SOURCE_TREE;OWN_MAIN" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock)
  shardtrain_test_build_speed(${name})
  if(NOT ARG_OWN_MAIN)
    target_link_libraries(${name} PRIVATE GTest::gtest_main)
  endif()
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(props TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    list(APPEND props LABELS "${ARG_LABELS}")
  endif()
  if(ARG_PROCESSES)
    target_compile_definitions(${name} PRIVATE
      SHARDTRAIN_BIN_DIR="${CMAKE_BINARY_DIR}/bin"
      SHARDTRAIN_BUILD_DIR="${CMAKE_BINARY_DIR}"
      SHARDTRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
    add_dependencies(${name} ps-server ps-worker)
    list(APPEND props RUN_SERIAL TRUE)
  elseif(ARG_SOURCE_TREE)
    target_compile_definitions(${name} PRIVATE SHARDTRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
endfunction()
