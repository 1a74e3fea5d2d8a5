# Debian packages with CPack, cut along the install components:
#
#   cmake --build build && (cd build && cpack -G DEB)
#
#   shardtrain_<version>_<arch>.deb      ps-server, ps-worker, psctl,
#       shardtrain-run and the Python package (shardtrain, shardtrain.torch)
#       for the interpreter the extension was built for; Depends computed
#       by dpkg-shlibdeps from the binaries' shared libraries, plus that
#       Python; Recommends python3-torch (for shardtrain.torch)
#   shardtrain-dev_<version>_<arch>.deb  the client library (static), its
#       headers and CMake package config; Depends on the -dev packages that
#       config finds
#   shardtrain-cuda_<version>_<arch>.deb (CUDA builds only) ps-worker-cuda,
#       which ps-worker runs for --device=cuda; it links NVIDIA's CUDA
#       runtime, cuBLAS and NCCL, which come from NVIDIA's apt repository
#       (no Debian package declares them: dpkg-shlibdeps cannot name them,
#       install them as deploy/Dockerfile's gpu flavour does)
#
# `apt install ./shardtrain_<version>_<arch>.deb` installs it with its
# dependencies (tests/deb_install_test.sh does, in a fresh Debian root).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME shardtrain)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "sharded parameter server for distributed neural-network training")
set(CPACK_PACKAGE_DESCRIPTION
    "Sharded ps-server processes hold a model's parameters and optimizer state; \
workers (ps-worker, or PyTorch scripts through the shardtrain Python package) \
push gradients and pull parameters over gRPC, synchronously or asynchronously.")
set(SHARDTRAIN_PACKAGE_MAINTAINER "shardtrain developers <shardtrain@localhost>" CACHE STRING
    "Maintainer field of the Debian packages")
set(CPACK_PACKAGE_CONTACT "${SHARDTRAIN_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Runtime Development)
if(TARGET ps-worker-cuda)
  list(APPEND CPACK_COMPONENTS_ALL Cuda)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME shardtrain)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION science)
if(SHARDTRAIN_PYTHON)
  # The extension is built for one Python ABI; shardtrain-run runs on it.
  math(EXPR python_next_minor "${Python3_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
      "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}~), python3 (<< ${Python3_VERSION_MAJOR}.${python_next_minor})")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS python3-torch)
  # Byte-compiles the package at install and removes the .pyc files before
  # removal, as Debian's Python packages do.
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
      ${PROJECT_SOURCE_DIR}/cmake/debian/postinst ${PROJECT_SOURCE_DIR}/cmake/debian/prerm)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)
endif()

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME shardtrain-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
# Static libraries: nothing for dpkg-shlibdeps; what shardtrainConfig.cmake finds.
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS
    "libgrpc++-dev, protobuf-compiler-grpc, libprotobuf-dev, libabsl-dev, prometheus-cpp-dev, libgoogle-glog-dev, libssl-dev, pkg-config")

set(CPACK_DEBIAN_CUDA_PACKAGE_NAME shardtrain-cuda)
set(CPACK_DEBIAN_CUDA_PACKAGE_SECTION science)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "shardtrain (= ${PROJECT_VERSION})")

include(CPack)
cpack_add_component(Runtime DISPLAY_NAME "binaries and Python package")
cpack_add_component(Development DISPLAY_NAME "client library, headers and CMake package config")
if(TARGET ps-worker-cuda)
  cpack_add_component(Cuda DISPLAY_NAME "the CUDA worker (ps-worker-cuda)")
endif()
