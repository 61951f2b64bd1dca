# The system libraries of //third_party/system as CMake targets
# "gradsync_system_<name>" (absl, protobuf, grpc, gtest,
# benchmark, gloo, torch), plus protoc and grpc_cpp_plugin for
# gradsync_cc_grpc_library.
#
# Each is looked up through its CMake package configuration where one exists
# (Debian ships them for gRPC, abseil, GoogleTest, benchmark and LibTorch)
# and otherwise by library name, with the same names Bazel links. Everything
# is found through CMAKE_PREFIX_PATH, so packages unpacked into a folder work
# as well as installed ones (deploy/gpu_run.sh does that); single paths can
# be overridden with the cache variables below (GRADSYNC_PROTOC,
# GRADSYNC_GRPC_CPP_PLUGIN, GLOO_INCLUDE_DIR, GLOO_LIBRARY, Torch_DIR, ...).

include_guard(GLOBAL)

find_package(Threads REQUIRED)

# Libraries by name (the fallback): sets <target> to an INTERFACE target
# linking each lib<name>.so found on the prefix path, or fails naming the
# missing ones.
function(_gradsync_link_by_name target what)
  set(missing "")
  set(libs "")
  foreach(name IN LISTS ARGN)
    find_library(GRADSYNC_LIB_${name} NAMES ${name})
    if(GRADSYNC_LIB_${name})
      list(APPEND libs "${GRADSYNC_LIB_${name}}")
    else()
      list(APPEND missing "lib${name}")
    endif()
  endforeach()
  if(missing)
    message(FATAL_ERROR "gradsync: ${what} not found: ${missing}. Install it "
      "(deploy/install_deps.sh) or add its prefix to CMAKE_PREFIX_PATH.")
  endif()
  target_link_libraries(${target} INTERFACE ${libs})
endfunction()

# --- abseil (libabsl-dev): the libraries //third_party/system:absl links.
set(_gradsync_absl_libs
  flags_parse flags_usage flags_usage_internal flags_internal
  flags_marshalling flags_reflection flags_config flags_program_name
  flags_private_handle_accessor flags_commandlineflag
  flags_commandlineflag_internal statusor status cord cordz_info
  cord_internal cordz_functions cordz_handle hash city low_level_hash
  raw_hash_set random_distributions random_seed_sequences
  random_internal_pool_urbg random_internal_randen
  random_internal_randen_hwaes random_internal_randen_hwaes_impl
  random_internal_randen_slow random_internal_platform
  random_internal_seed_material random_seed_gen_exception synchronization
  graphcycles_internal stacktrace symbolize debugging_internal
  demangle_internal malloc_internal time civil_time time_zone
  str_format_internal strings strings_internal int128 throw_delegate
  raw_logging_internal log_severity spinlock_wait base bad_optional_access
  bad_variant_access strerror)
add_library(gradsync_system_absl INTERFACE)
find_package(absl CONFIG QUIET)
if(absl_FOUND)
  foreach(name IN LISTS _gradsync_absl_libs)
    if(TARGET absl::${name})
      target_link_libraries(gradsync_system_absl INTERFACE absl::${name})
    endif()
  endforeach()
else()
  list(TRANSFORM _gradsync_absl_libs PREPEND absl_ OUTPUT_VARIABLE _names)
  _gradsync_link_by_name(gradsync_system_absl "abseil" ${_names})
endif()
target_link_libraries(gradsync_system_absl INTERFACE Threads::Threads)

# --- protobuf (libprotobuf-dev, protobuf-compiler) and gRPC
# (libgrpc++-dev, protobuf-compiler-grpc). CMake's FindProtobuf finds
# protoc and libprotobuf; gRPC's configuration needs re2, which Debian
# describes only through pkg-config: without pkg-config (a bare GPU machine)
# it is found by name here first.
find_package(Protobuf REQUIRED)
if(NOT TARGET re2::re2)
  find_package(re2 CONFIG QUIET)
endif()
if(NOT TARGET re2::re2)
  find_library(GRADSYNC_RE2_LIBRARY re2)
  find_path(GRADSYNC_RE2_INCLUDE_DIR re2/re2.h)
  if(GRADSYNC_RE2_LIBRARY AND GRADSYNC_RE2_INCLUDE_DIR)
    add_library(re2::re2 UNKNOWN IMPORTED)
    set_target_properties(re2::re2 PROPERTIES
      IMPORTED_LOCATION "${GRADSYNC_RE2_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${GRADSYNC_RE2_INCLUDE_DIR}")
    set(re2_FOUND TRUE)
  endif()
endif()
find_package(gRPC CONFIG QUIET)

add_library(gradsync_system_protobuf INTERFACE)
target_link_libraries(gradsync_system_protobuf INTERFACE
  protobuf::libprotobuf gradsync_system_absl)

add_library(gradsync_system_grpc INTERFACE)
if(gRPC_FOUND)
  target_link_libraries(gradsync_system_grpc INTERFACE
    gRPC::grpc++_reflection gRPC::grpc++ gRPC::grpc gRPC::gpr
    gRPC::address_sorting)
else()
  _gradsync_link_by_name(gradsync_system_grpc "gRPC"
    grpc++_reflection grpc++ grpc gpr address_sorting)
endif()
target_link_libraries(gradsync_system_grpc INTERFACE
  gradsync_system_absl gradsync_system_protobuf)

set(GRADSYNC_PROTOC "${Protobuf_PROTOC_EXECUTABLE}" CACHE FILEPATH
  "protoc used for the .proto files")
set(_plugin_hint "")
if(TARGET gRPC::grpc_cpp_plugin)
  get_target_property(_plugin_hint gRPC::grpc_cpp_plugin LOCATION)
  get_filename_component(_plugin_hint "${_plugin_hint}" DIRECTORY)
endif()
find_program(GRADSYNC_GRPC_CPP_PLUGIN NAMES grpc_cpp_plugin HINTS ${_plugin_hint}
  DOC "protoc plugin for C++ gRPC services")
if(NOT GRADSYNC_PROTOC OR NOT GRADSYNC_GRPC_CPP_PLUGIN)
  message(FATAL_ERROR "gradsync: protoc (${GRADSYNC_PROTOC}) or grpc_cpp_plugin "
    "(${GRADSYNC_GRPC_CPP_PLUGIN}) not found: install protobuf-compiler and "
    "protobuf-compiler-grpc or set GRADSYNC_PROTOC / GRADSYNC_GRPC_CPP_PLUGIN.")
endif()
# Where google/protobuf/*.proto live (Bazel: --proto_path=/usr/include).
find_path(GRADSYNC_PROTOBUF_INCLUDE_DIR google/protobuf/descriptor.proto
  HINTS ${Protobuf_INCLUDE_DIRS})
if(NOT GRADSYNC_PROTOBUF_INCLUDE_DIR)
  message(FATAL_ERROR "gradsync: google/protobuf/descriptor.proto not found "
    "(libprotobuf-dev); set GRADSYNC_PROTOBUF_INCLUDE_DIR.")
endif()
# protobuf's headers alone, in a folder of their own, for a target that must
# put them before PyTorch's include folder: PyTorch 2.x wheels ship an older
# protobuf's headers there (torch/include/google/protobuf), which the code
# this protoc generated does not compile against.
set(GRADSYNC_PROTOBUF_ONLY_INCLUDE_DIR
  "${PROJECT_BINARY_DIR}/third_party/system/protobuf_include")
file(MAKE_DIRECTORY "${GRADSYNC_PROTOBUF_ONLY_INCLUDE_DIR}/google")
file(CREATE_LINK "${GRADSYNC_PROTOBUF_INCLUDE_DIR}/google/protobuf"
  "${GRADSYNC_PROTOBUF_ONLY_INCLUDE_DIR}/google/protobuf" SYMBOLIC)

# --- GoogleTest (libgtest-dev, libgmock-dev).
if(GRADSYNC_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  add_library(gradsync_system_gtest INTERFACE)
  target_link_libraries(gradsync_system_gtest INTERFACE
    GTest::gmock GTest::gtest Threads::Threads)
endif()

# --- Google Benchmark (libbenchmark-dev); nothing uses it yet.
find_package(benchmark CONFIG QUIET)
add_library(gradsync_system_benchmark INTERFACE)
if(benchmark_FOUND)
  target_link_libraries(gradsync_system_benchmark INTERFACE
    benchmark::benchmark Threads::Threads)
else()
  gradsync_disable(gradsync_system_benchmark "Google Benchmark not found")
endif()

# --- Gloo (libgloo-dev). Debian's GlooConfig.cmake names /usr/lib/libgloo.so
# by absolute path, which breaks for unpacked packages: look it up by name.
find_path(GLOO_INCLUDE_DIR gloo/allreduce.h)
find_library(GLOO_LIBRARY gloo)
if(NOT GLOO_INCLUDE_DIR OR NOT GLOO_LIBRARY)
  message(FATAL_ERROR "gradsync: Gloo not found (gloo/allreduce.h: "
    "${GLOO_INCLUDE_DIR}, libgloo: ${GLOO_LIBRARY}); install libgloo-dev or "
    "set GLOO_INCLUDE_DIR and GLOO_LIBRARY.")
endif()
add_library(gradsync_system_gloo INTERFACE)
target_include_directories(gradsync_system_gloo SYSTEM INTERFACE "${GLOO_INCLUDE_DIR}")
target_link_libraries(gradsync_system_gloo INTERFACE "${GLOO_LIBRARY}")

# --- LibTorch: Debian's libtorch-dev (CPU) or a vendor build, e.g. the one in
# PyTorch's wheel: -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;
# print(torch.utils.cmake_prefix_path)')".
add_library(gradsync_system_torch INTERFACE)
if(GRADSYNC_WITH_TORCH)
  find_package(Torch REQUIRED)
  target_link_libraries(gradsync_system_torch INTERFACE ${TORCH_LIBRARIES} Threads::Threads)
  # The C++ standard LibTorch's headers need (PyTorch 2.13 and later: C++20;
  # TorchConfig.cmake sets it on its own target, which does not pass it on):
  # the code that includes them compiles with it.
  if(TARGET torch)
    get_target_property(_torch_std torch CXX_STANDARD)
    if(_torch_std AND _torch_std GREATER CMAKE_CXX_STANDARD)
      target_compile_features(gradsync_system_torch INTERFACE cxx_std_${_torch_std})
      message(STATUS "gradsync: LibTorch ${Torch_VERSION} needs C++${_torch_std}: "
        "its users compile with it")
    endif()
  endif()
  # A LibTorch with CUDA: collectives order after its current stream
  # (worker/ddp/tensor_buffer.cc uses c10_cuda).
  if(TORCH_CUDA_LIBRARIES)
    target_compile_definitions(gradsync_system_torch INTERFACE GRADSYNC_TORCH_CUDA)
  endif()
  include(GradsyncAbiCheck)
  gradsync_check_torch_abi()
else()
  gradsync_disable(gradsync_system_torch "GRADSYNC_WITH_TORCH=OFF")
endif()

# --- SQLite (libsqlite3-dev): the coordinator's durable state (--state_dir).
add_library(gradsync_system_sqlite3 INTERFACE)
_gradsync_link_by_name(gradsync_system_sqlite3 "SQLite" sqlite3)

# --- cpp-httplib (libcpp-httplib-dev): the coordinator's /metrics endpoint.
# Debian builds it with TLS, zlib and brotli; the same defines keep its
# classes' layout identical on both sides. No CMake configuration: by name.
find_path(HTTPLIB_INCLUDE_DIR httplib.h)
if(NOT HTTPLIB_INCLUDE_DIR)
  message(FATAL_ERROR "gradsync: httplib.h not found: install libcpp-httplib-dev "
    "or set HTTPLIB_INCLUDE_DIR.")
endif()
# --- OpenSSL's libcrypto (libssl-dev), for the coordinator's tokens.
add_library(gradsync_system_crypto INTERFACE)
_gradsync_link_by_name(gradsync_system_crypto "libcrypto" crypto)

add_library(gradsync_system_httplib INTERFACE)
target_include_directories(gradsync_system_httplib SYSTEM INTERFACE "${HTTPLIB_INCLUDE_DIR}")
target_compile_definitions(gradsync_system_httplib INTERFACE
  CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)
_gradsync_link_by_name(gradsync_system_httplib "cpp-httplib" cpp-httplib ssl crypto)
target_link_libraries(gradsync_system_httplib INTERFACE Threads::Threads)

# --- prometheus-cpp (prometheus-cpp-dev): the coordinator's metrics, their
# registry and the text exposition format; its core library only, by name
# (its CMake configuration also wants the pull and push libraries' deps).
add_library(gradsync_system_prometheus_cpp INTERFACE)
_gradsync_link_by_name(gradsync_system_prometheus_cpp "prometheus-cpp" prometheus-cpp-core)

# --- nghttp2 (libnghttp2-dev): the HTTP/2 library of the benchmarks' lean
# gRPC load generator (bench/h2_unary_client.h).
add_library(gradsync_system_nghttp2 INTERFACE)
_gradsync_link_by_name(gradsync_system_nghttp2 "nghttp2" nghttp2)

# --- etcd's v3 API (golang-etcd-server-dev, with golang-github-gogo-protobuf-dev
# and golang-github-grpc-ecosystem-grpc-gateway-dev), the client of the
# coordinator's --etcd: its .proto files compiled unchanged. The coordinator
# needs them: without them it is left out, with everything that needs it (on
# a GPU machine deploy/gpu_run.sh takes them from deploy/pack_gpu_deps.sh).
set(GRADSYNC_GOCODE_DIR "/usr/share/gocode/src" CACHE PATH
  "Where Debian's golang-*-dev packages keep their sources (etcd's .proto files)")
set(_etcd_roots
  "${GRADSYNC_GOCODE_DIR}/go.etcd.io"
  "${GRADSYNC_GOCODE_DIR}/github.com/gogo/protobuf"
  "${GRADSYNC_GOCODE_DIR}/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis")
set(_etcd_protos  # "<root index>:<path under the root>"
  "0:etcd/etcdserver/etcdserverpb/rpc.proto"
  "0:etcd/etcdserver/api/v3election/v3electionpb/v3election.proto"
  "0:etcd/mvcc/mvccpb/kv.proto"
  "0:etcd/auth/authpb/auth.proto"
  "1:gogoproto/gogo.proto"
  "2:google/api/annotations.proto"
  "2:google/api/http.proto")
set(_etcd_out "${PROJECT_BINARY_DIR}/third_party/system/etcd_v3")
set(_etcd_files "")
set(_etcd_srcs "")
set(_etcd_missing "")
foreach(entry IN LISTS _etcd_protos)
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 root_index)
  list(GET parts 1 path)
  list(GET _etcd_roots ${root_index} root)
  if(NOT EXISTS "${root}/${path}")
    list(APPEND _etcd_missing "${root}/${path}")
  endif()
  list(APPEND _etcd_files "${root}/${path}")
  string(REGEX REPLACE "\\.proto$" "" base "${_etcd_out}/${path}")
  list(APPEND _etcd_srcs "${base}.pb.cc" "${base}.grpc.pb.cc")
  list(APPEND _etcd_hdrs "${base}.pb.h" "${base}.grpc.pb.h")
endforeach()
if(_etcd_missing)
  add_library(gradsync_system_etcd_v3 INTERFACE)
  gradsync_disable(gradsync_system_etcd_v3
    "etcd's .proto files not found (install golang-etcd-server-dev)")
else()
  set(_etcd_proto_paths "")
  foreach(root IN LISTS _etcd_roots)
    list(APPEND _etcd_proto_paths "--proto_path=${root}")
  endforeach()
  file(MAKE_DIRECTORY "${_etcd_out}")
  add_custom_command(
    OUTPUT ${_etcd_srcs} ${_etcd_hdrs}
    COMMAND "${GRADSYNC_PROTOC}" ${_etcd_proto_paths}
      "--proto_path=${GRADSYNC_PROTOBUF_INCLUDE_DIR}"
      "--cpp_out=${_etcd_out}" "--grpc_out=${_etcd_out}"
      "--plugin=protoc-gen-grpc=${GRADSYNC_GRPC_CPP_PLUGIN}" ${_etcd_files}
    DEPENDS ${_etcd_files}
    COMMENT "protoc: etcd's v3 API")
  add_library(gradsync_system_etcd_v3 STATIC ${_etcd_srcs} ${_etcd_hdrs})
  target_include_directories(gradsync_system_etcd_v3 PUBLIC "${_etcd_out}")
  target_link_libraries(gradsync_system_etcd_v3 PUBLIC gradsync_system_grpc)
endif()
