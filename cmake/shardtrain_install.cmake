# Install layout and the exported client library.
#
#   cmake --install build [--prefix /usr/local]
#
# puts the binaries in bin/, the Python package in
# SHARDTRAIN_PYTHON_INSTALL_DIR, and the client library (static, with the
# project libraries it links), its headers under include/shardtrain/ and a
# package config in lib/cmake/shardtrain/, so another CMake project can
#
#   find_package(shardtrain CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE shardtrain::client)
#
# and `#include "client/ps_client.h"`. Install components: Runtime (binaries,
# Python package) and Development (libraries, headers, CMake files); the
# Debian packages (cmake/shardtrain_package.cmake) are cut along them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHARDTRAIN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/shardtrain)
set(SHARDTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardtrain)

# Installed binaries find the libraries of non-system link directories
# (e.g. CUDA's under /usr/local/cuda) without LD_LIBRARY_PATH; libraries in
# the system's own directories add nothing.
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)

# Where the Python package `shardtrain` goes, relative to the prefix (or
# absolute). Empty (the default): decided at install time by the prefix,
# as Debian's interpreter looks for modules: lib/python3/dist-packages
# under a prefix ending in /usr (a .deb, whose files CPack installs under
# .../usr; or --prefix /usr), lib/python3.X/dist-packages under another
# (/usr/local), or site-packages for an interpreter that is not Debian's.
set(SHARDTRAIN_PYTHON_INSTALL_DIR "" CACHE PATH
    "Where the shardtrain Python package is installed (relative to the prefix, or absolute; empty: by the prefix)")
if(Python3_SITEARCH MATCHES "dist-packages")
  set(SHARDTRAIN_PYTHON_SITE_DIR lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages)
else()
  set(SHARDTRAIN_PYTHON_SITE_DIR lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/site-packages)
endif()

# shardtrain_install_binaries(target... [COMPONENT component])
# Binaries into bin/, of the Runtime component unless another is named.
function(shardtrain_install_binaries)
  cmake_parse_arguments(ARG "" "COMPONENT" "" ${ARGN})
  if(NOT ARG_COMPONENT)
    set(ARG_COMPONENT Runtime)
  endif()
  install(TARGETS ${ARG_UNPARSED_ARGUMENTS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
    COMPONENT ${ARG_COMPONENT})
endfunction()

# shardtrain_install_library(TARGET NAME name)
# Exports library TARGET as shardtrain::NAME (an alias of the same name
# exists in the build tree) and installs it with the headers of its sources
# (foo.h beside foo.cc, internal/ left out) and every project header those
# include, generated ones too.
function(shardtrain_install_library target)
  cmake_parse_arguments(ARG "" "NAME" "" ${ARGN})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_NAME})
  add_library(shardtrain::${ARG_NAME} ALIAS ${target})
  install(TARGETS ${target} EXPORT shardtrainTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
    INCLUDES DESTINATION ${SHARDTRAIN_INSTALL_INCLUDEDIR})
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  if(NOT sources)
    return()
  endif()
  set(headers)
  foreach(source ${sources})
    if(IS_ABSOLUTE "${source}")
      set(path "${source}")
    else()
      set(path "${source_dir}/${source}")
    endif()
    string(REGEX REPLACE "\\.(cc|cpp|cu)$" ".h" header "${path}")
    file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} "${header}")
    # Generated sources (under the build tree) bring their headers only
    # when a header includes one.
    string(FIND "${header}" "${CMAKE_BINARY_DIR}/" in_build)
    if(EXISTS "${header}" AND in_build EQUAL -1 AND NOT relative MATCHES "(^|/)internal/"
       AND NOT relative MATCHES "^\\.\\.")
      list(APPEND headers ${relative})
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY SHARDTRAIN_PUBLIC_HEADERS ${headers})
endfunction()

# shardtrain_generated_headers(LIBRARY header...)
# Records the headers a generator writes into the build tree for LIBRARY,
# as paths relative to CMAKE_BINARY_DIR ("proto/shardtrain.pb.h"), so that
# the headers' closure below can install them.
function(shardtrain_generated_headers library)
  set_property(GLOBAL APPEND PROPERTY SHARDTRAIN_GENERATED_LIBRARIES ${library})
  set_property(GLOBAL APPEND PROPERTY SHARDTRAIN_GENERATED_HEADERS_${library} ${ARGN})
endfunction()

# Installs the recorded public headers and every project header they
# include (quoted includes resolved against the source root, the generated
# headers, and the including file's directory), keeping their paths under
# include/shardtrain/. A generated header brings every header generated for
# its library (their includes cannot be read before the build).
function(_shardtrain_install_header_closure)
  get_property(todo GLOBAL PROPERTY SHARDTRAIN_PUBLIC_HEADERS)
  get_property(libraries GLOBAL PROPERTY SHARDTRAIN_GENERATED_LIBRARIES)
  foreach(library ${libraries})
    get_property(files GLOBAL PROPERTY SHARDTRAIN_GENERATED_HEADERS_${library})
    foreach(file ${files})
      string(MAKE_C_IDENTIFIER "${file}" key)
      set(library_of_${key} ${library})
    endforeach()
  endforeach()
  set(done)
  while(todo)
    list(POP_FRONT todo header)
    if(header IN_LIST done)
      continue()
    endif()
    list(APPEND done ${header})
    string(MAKE_C_IDENTIFIER "${header}" key)
    if(DEFINED library_of_${key})
      get_property(siblings GLOBAL PROPERTY SHARDTRAIN_GENERATED_HEADERS_${library_of_${key}})
      list(APPEND todo ${siblings})
      continue()
    endif()
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    get_filename_component(dir ${header} DIRECTORY)
    foreach(line ${lines})
      string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*$" "\\1" included "${line}")
      string(MAKE_C_IDENTIFIER "${included}" included_key)
      if(DEFINED library_of_${included_key} OR EXISTS ${PROJECT_SOURCE_DIR}/${included})
        list(APPEND todo ${included})
      elseif(dir AND EXISTS ${PROJECT_SOURCE_DIR}/${dir}/${included})
        list(APPEND todo ${dir}/${included})
      endif()
    endforeach()
  endwhile()
  foreach(header ${done})
    string(MAKE_C_IDENTIFIER "${header}" key)
    if(DEFINED library_of_${key})
      set(file ${CMAKE_BINARY_DIR}/${header})
    else()
      set(file ${PROJECT_SOURCE_DIR}/${header})
    endif()
    get_filename_component(dir ${header} DIRECTORY)
    install(FILES ${file} DESTINATION ${SHARDTRAIN_INSTALL_INCLUDEDIR}/${dir}
            COMPONENT Development)
  endforeach()
endfunction()

# After every component: headers, the export set and the package config.
function(shardtrain_install_package_config)
  _shardtrain_install_header_closure()
  install(EXPORT shardtrainTargets
    NAMESPACE shardtrain::
    FILE shardtrainTargets.cmake
    DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR}
    COMPONENT Development)
  configure_package_config_file(
    ${PROJECT_SOURCE_DIR}/cmake/shardtrainConfig.cmake.in
    ${PROJECT_BINARY_DIR}/shardtrainConfig.cmake
    INSTALL_DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR})
  write_basic_package_version_file(
    ${PROJECT_BINARY_DIR}/shardtrainConfigVersion.cmake
    VERSION ${PROJECT_VERSION}
    # 0.x: a minor release may change the API.
    COMPATIBILITY SameMinorVersion)
  install(FILES
      ${PROJECT_BINARY_DIR}/shardtrainConfig.cmake
      ${PROJECT_BINARY_DIR}/shardtrainConfigVersion.cmake
    DESTINATION ${SHARDTRAIN_INSTALL_CMAKEDIR}
    COMPONENT Development)
endfunction()
