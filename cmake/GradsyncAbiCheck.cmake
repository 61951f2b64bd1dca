# gradsync_check_torch_abi(): fails at configure time, with what to do, when
# LibTorch's C++ ABI (_GLIBCXX_USE_CXX11_ABI in TORCH_CXX_FLAGS) is not the
# one abseil, protobuf and gRPC were built with. Debian builds all of them
# with the C++11 ABI (1); PyTorch's wheels before 2.7 and the "pre-cxx11"
# LibTorch downloads use 0. Mixed, the link fails much later with undefined
# std::string symbols, or worse, it links and crashes.
#
# The check compiles a program with LibTorch's flag that calls out-of-line
# functions of abseil, protobuf and gRPC taking or returning std::string:
# it links only if their ABI is the same.

include_guard(GLOBAL)
include(CheckCXXSourceCompiles)
include(CMakePushCheckState)

function(gradsync_check_torch_abi)
  if(NOT TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    message(STATUS "gradsync: LibTorch states no _GLIBCXX_USE_CXX11_ABI; assuming the compiler's default")
    return()
  endif()
  set(torch_abi "${CMAKE_MATCH_1}")
  # Imported targets where the packages have them, else the libraries found
  # by name (try_compile takes no plain INTERFACE targets).
  set(libs "")
  foreach(pair "absl::strings;absl_strings" "protobuf::libprotobuf;protobuf"
               "gRPC::grpc++;grpc++")
    list(GET pair 0 target)
    list(GET pair 1 name)
    if(TARGET ${target})
      list(APPEND libs ${target})
    else()
      list(APPEND libs "${GRADSYNC_LIB_${name}}")
    endif()
  endforeach()
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=${torch_abi}")
  set(CMAKE_REQUIRED_LIBRARIES ${libs} Threads::Threads)
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles([[
    #include <string>
    #include "absl/strings/str_cat.h"
    #include "google/protobuf/descriptor.h"
    #include "grpcpp/grpcpp.h"
    int main(int argc, char**) {
      std::string name = absl::StrCat("gradsync.v1.", argc);
      auto* pool = google::protobuf::DescriptorPool::generated_pool();
      auto channel = grpc::CreateChannel(name, grpc::InsecureChannelCredentials());
      return pool->FindMessageTypeByName(name) == nullptr && channel ? 0 : 1;
    }
  ]] GRADSYNC_ABI_MATCHES_TORCH_${torch_abi})
  cmake_pop_check_state()
  if(NOT GRADSYNC_ABI_MATCHES_TORCH_${torch_abi})
    message(FATAL_ERROR
      "gradsync: C++ ABI mismatch. LibTorch (${TORCH_INSTALL_PREFIX}) is built "
      "with -D_GLIBCXX_USE_CXX11_ABI=${torch_abi}, but abseil/protobuf/gRPC "
      "(${libs}) do not link with that flag, so they use the other ABI. Use a "
      "LibTorch built with the same ABI as them (Debian's are "
      "_GLIBCXX_USE_CXX11_ABI=1: PyTorch >= 2.7 wheels or the "
      "'cxx11-abi' LibTorch downloads), or gRPC/protobuf/abseil built with "
      "_GLIBCXX_USE_CXX11_ABI=${torch_abi}, or configure with "
      "-DGRADSYNC_WITH_TORCH=OFF (no DDP, no trainer). The failed check's log "
      "is in ${CMAKE_BINARY_DIR}/CMakeFiles (CMakeError.log or CMakeConfigureLog.yaml).")
  endif()
  message(STATUS "gradsync: LibTorch and gRPC/protobuf/abseil share _GLIBCXX_USE_CXX11_ABI=${torch_abi}")
endfunction()
