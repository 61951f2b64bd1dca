# CUDA and NCCL for the NCCL backend: the CMake side of
# bazel/cuda_configure.bzl. Defines gradsync_system_cuda_nccl (Bazel's
# @local_cuda//:cuda_nccl: headers and -lnccl -lcudart) and
# GRADSYNC_HAS_NCCL.
#
# GRADSYNC_WITH_NCCL:
#   AUTO (default)  build the NCCL backend where nccl.h, cuda_runtime_api.h,
#                   libnccl and libcudart are found, leave it out elsewhere;
#   ON              the same, but fail when one is missing (GPU machines);
#   OFF             leave it out.
# Looked up in CUDA_HOME (cache variable, default $CUDA_HOME or
# /usr/local/cuda: include/, lib64/) and NCCL_ROOT (default $NCCL_ROOT, e.g.
# the nvidia-nccl wheel's folder: include/, lib/), then the system paths.
# NCCL_INCLUDE_DIR, NCCL_LIBRARY, CUDART_INCLUDE_DIR and CUDART_LIBRARY
# override single paths.

include_guard(GLOBAL)

set(GRADSYNC_WITH_NCCL AUTO CACHE STRING "Build the NCCL backend: AUTO, ON or OFF")
set_property(CACHE GRADSYNC_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
set(_cuda_home_default "/usr/local/cuda")
if(DEFINED ENV{CUDA_HOME} AND NOT "$ENV{CUDA_HOME}" STREQUAL "")
  set(_cuda_home_default "$ENV{CUDA_HOME}")
endif()
set(CUDA_HOME "${_cuda_home_default}" CACHE PATH "CUDA toolkit folder (include/, lib64/)")
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL folder (include/, lib/) if not in CUDA_HOME")

add_library(gradsync_system_cuda_nccl INTERFACE)
set(GRADSYNC_HAS_NCCL OFF)
if(GRADSYNC_WITH_NCCL STREQUAL "OFF")
  gradsync_disable(gradsync_system_cuda_nccl "GRADSYNC_WITH_NCCL=OFF")
  return()
endif()

set(_hints "${NCCL_ROOT}" "${CUDA_HOME}")
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_hints} PATH_SUFFIXES include)
# The nvidia-nccl wheel ships only libnccl.so.2.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_hints} PATH_SUFFIXES lib64 lib)
find_path(CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS "${CUDA_HOME}" PATH_SUFFIXES include)
find_library(CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12
  HINTS "${CUDA_HOME}" PATH_SUFFIXES lib64 lib)

set(_missing "")
foreach(var NCCL_INCLUDE_DIR NCCL_LIBRARY CUDART_INCLUDE_DIR CUDART_LIBRARY)
  if(NOT ${var})
    list(APPEND _missing ${var})
  endif()
endforeach()
if(_missing)
  set(_why "not found: ${_missing} (CUDA_HOME=${CUDA_HOME}, NCCL_ROOT=${NCCL_ROOT})")
  if(GRADSYNC_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "gradsync: GRADSYNC_WITH_NCCL=ON but CUDA/NCCL ${_why}")
  endif()
  message(STATUS "gradsync: NCCL backend left out: CUDA/NCCL ${_why}")
  gradsync_disable(gradsync_system_cuda_nccl "CUDA/NCCL ${_why}")
  return()
endif()

target_include_directories(gradsync_system_cuda_nccl SYSTEM INTERFACE
  "${NCCL_INCLUDE_DIR}" "${CUDART_INCLUDE_DIR}")
target_link_libraries(gradsync_system_cuda_nccl INTERFACE
  "${NCCL_LIBRARY}" "${CUDART_LIBRARY}")
set(GRADSYNC_HAS_NCCL ON)
message(STATUS "gradsync: NCCL backend: ${NCCL_LIBRARY}, ${CUDART_LIBRARY}")
