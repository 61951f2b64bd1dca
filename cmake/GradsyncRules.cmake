# Bazel-shaped rules for the CMake build, so that every CMakeLists.txt reads
# like the BUILD.bazel beside it and a new Bazel target is mirrored by copying
# its attributes:
#
#   gradsync_cc_library(NAME n [SRCS ..] [HDRS ..] [DEPS ..] [OPTIONAL_DEPS ..]
#                       [DEFINES ..])
#   gradsync_cc_binary(NAME n SRCS .. [DEPS ..])
#   gradsync_cc_test(NAME n SRCS .. [DEPS ..] [DATA ..] [SIZE small|medium|large])
#   gradsync_cc_grpc_library(NAME n SRCS a.proto .. [DEPS ..])
#
# DEPS and DATA take Bazel labels (DATA also file names of this folder):
# ":name" (this folder), "//pkg:name", "//pkg" (= "//pkg:last"),
# "//third_party/system:lib" (GradsyncDeps.cmake) and
# "@local_cuda//:cuda_nccl" (GradsyncCuda.cmake). A label becomes the target
# "<pkg with / as _>_<name>"; binaries and tests keep their Bazel name as file
# name, in the same folder of the build tree as in bazel-bin.
# cmake/check_mirror.py checks that the rules match the BUILD.bazel files
# (and --fix makes them match).
#
# Optional dependencies: a target with a dependency that is switched off
# (LibTorch with GRADSYNC_WITH_TORCH=OFF, CUDA/NCCL not found) is left out,
# and so is everything depending on it. That needs dependencies declared
# before their users: parents add their subdirectories first, and folders
# are added in dependency order (Bazel's layering: proto, common, server,
# worker, bench, tests). OPTIONAL_DEPS are linked when they are built and
# skipped silently otherwise (Bazel's `+ ([..] if HAS_NCCL else [])`).

include_guard(GLOBAL)
include(GoogleTest)

# The package of the current CMakeLists.txt, e.g. "worker/backend".
function(_gradsync_package out)
  file(RELATIVE_PATH pkg "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}")
  set(${out} "${pkg}" PARENT_SCOPE)
endfunction()

# The CMake target name of a Bazel label.
function(gradsync_target_of label out)
  _gradsync_package(pkg)
  if(label MATCHES "^@local_cuda//:cuda_nccl$")
    set(target gradsync_system_cuda_nccl)
  elseif(label MATCHES "^//third_party/system:(.+)$")
    set(target "gradsync_system_${CMAKE_MATCH_1}")
  elseif(label MATCHES "^//([^:]+):(.+)$")
    string(REPLACE "/" "_" p "${CMAKE_MATCH_1}")
    set(target "${p}_${CMAKE_MATCH_2}")
  elseif(label MATCHES "^//([^:]+)$")
    get_filename_component(last "${CMAKE_MATCH_1}" NAME)
    string(REPLACE "/" "_" p "${CMAKE_MATCH_1}")
    set(target "${p}_${last}")
  elseif(label MATCHES "^:(.+)$")
    string(REPLACE "/" "_" p "${pkg}")
    set(target "${p}_${CMAKE_MATCH_1}")
  else()
    message(FATAL_ERROR "${pkg}: '${label}' is not a label gradsync's CMake rules know")
  endif()
  set(${out} "${target}" PARENT_SCOPE)
endfunction()

# Marks a target as left out of this build (see "Optional dependencies").
function(gradsync_disable target why)
  set_property(GLOBAL APPEND PROPERTY GRADSYNC_DISABLED_TARGETS "${target}")
  set_property(GLOBAL PROPERTY "GRADSYNC_DISABLED_WHY_${target}" "${why}")
endfunction()

# Sets <out_targets> to the targets of <labels> and <out_skip> to the reason
# the rule must be left out ("" when all its dependencies are built).
function(_gradsync_resolve labels out_targets out_skip)
  get_property(disabled GLOBAL PROPERTY GRADSYNC_DISABLED_TARGETS)
  set(targets "")
  set(skip "")
  foreach(label IN LISTS labels)
    gradsync_target_of("${label}" t)
    if(t IN_LIST disabled)
      # The first cause, not a chain of dependents.
      get_property(why GLOBAL PROPERTY "GRADSYNC_DISABLED_WHY_${t}")
      string(REGEX REPLACE "^.* is left out \\((.*)\\)$" "\\1" why "${why}")
      set(skip "${label} is left out (${why})")
    endif()
    list(APPEND targets "${t}")
  endforeach()
  set(${out_targets} "${targets}" PARENT_SCOPE)
  set(${out_skip} "${skip}" PARENT_SCOPE)
endfunction()

# Parses a rule's arguments into R_NAME, R_SRCS, ... and the target name
# R_TARGET; returns from the calling rule (a macro's return()) when a
# dependency is left out.
macro(_gradsync_rule_begin)
  cmake_parse_arguments(R "" "NAME;SIZE" "SRCS;HDRS;DEPS;OPTIONAL_DEPS;DATA;DEFINES" ${ARGN})
  gradsync_target_of(":${R_NAME}" R_TARGET)
  _gradsync_resolve("${R_DEPS}" R_DEP_TARGETS R_SKIP)
  foreach(label IN LISTS R_OPTIONAL_DEPS)
    _gradsync_resolve("${label}" t optional_skip)
    if(NOT optional_skip)
      list(APPEND R_DEP_TARGETS ${t})
    endif()
  endforeach()
  # A test whose data includes a binary that is left out is left out too.
  set(_data_labels "")
  foreach(data IN LISTS R_DATA)
    if(data MATCHES "^[/:@]")
      list(APPEND _data_labels "${data}")
    endif()
  endforeach()
  _gradsync_resolve("${_data_labels}" _data_targets _data_skip)
  if(NOT R_SKIP AND _data_skip)
    set(R_SKIP "${_data_skip}")
  endif()
  if(R_SKIP)
    gradsync_disable("${R_TARGET}" "${R_SKIP}")
    message(STATUS "gradsync: leaving out ${R_TARGET}: ${R_SKIP}")
    return()
  endif()
  foreach(t IN LISTS R_DEP_TARGETS)
    set_property(GLOBAL APPEND PROPERTY GRADSYNC_REFERENCES "${R_TARGET}>${t}")
  endforeach()
endmacro()

# The executable of a binary or test rule, named as in Bazel.
macro(_gradsync_executable)
  _gradsync_rule_begin(${ARGN})
  add_executable(${R_TARGET} ${R_SRCS})
  set_target_properties(${R_TARGET} PROPERTIES OUTPUT_NAME "${R_NAME}")
  target_link_libraries(${R_TARGET} PRIVATE ${R_DEP_TARGETS})
endmacro()

# Called once all folders are added: fails on a dependency no CMakeLists.txt
# defines, or one left out after its user was already made (declared too
# late), rather than letting the linker look for "-l<target>".
function(gradsync_check_references)
  get_property(refs GLOBAL PROPERTY GRADSYNC_REFERENCES)
  get_property(disabled GLOBAL PROPERTY GRADSYNC_DISABLED_TARGETS)
  foreach(ref IN LISTS refs)
    string(REPLACE ">" ";" pair "${ref}")
    list(GET pair 0 user)
    list(GET pair 1 dep)
    if(TARGET ${dep})
      continue()
    elseif(dep IN_LIST disabled)
      message(FATAL_ERROR "gradsync: ${user} depends on ${dep}, which is left out, "
        "but was declared after ${user}: add ${dep}'s folder (or rule) before ${user}'s.")
    else()
      message(FATAL_ERROR "gradsync: ${user} depends on ${dep}, which no "
        "CMakeLists.txt defines (cmake/check_mirror.py finds what is missing).")
    endif()
  endforeach()
endfunction()

function(gradsync_cc_library)
  _gradsync_rule_begin(${ARGN})
  # The headers, for installing the public library (GradsyncInstall.cmake).
  list(TRANSFORM R_HDRS PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/" OUTPUT_VARIABLE hdrs)
  set_property(GLOBAL PROPERTY "GRADSYNC_HDRS_${R_TARGET}" ${hdrs})
  if(R_SRCS)
    add_library(${R_TARGET} STATIC ${R_SRCS} ${R_HDRS})
    target_link_libraries(${R_TARGET} PUBLIC ${R_DEP_TARGETS})
    target_compile_definitions(${R_TARGET} PUBLIC ${R_DEFINES})
  else()  # header-only
    add_library(${R_TARGET} INTERFACE)
    target_link_libraries(${R_TARGET} INTERFACE ${R_DEP_TARGETS})
    target_compile_definitions(${R_TARGET} INTERFACE ${R_DEFINES})
  endif()
endfunction()

function(gradsync_cc_binary)
  _gradsync_executable(${ARGN})
endfunction()

# A test binary; each of its gtest cases becomes one ctest test named
# "<name>.<Suite>.<Case>", labelled with the test's package and size. The
# cases are listed when ctest runs (PRE_TEST), so building needs no run.
# TEST_SRCDIR/TEST_WORKSPACE point Runfile() at the build tree, which has
# bazel-bin's layout, and TEST_TMPDIR is a folder of the test's own.
function(gradsync_cc_test)
  _gradsync_executable(${ARGN})
  # DATA: binaries are built first; files are copied to the same place in
  # the build tree (Runfile() finds them there).
  foreach(data IN LISTS R_DATA)
    if(data MATCHES "^[/:@]")
      gradsync_target_of("${data}" t)
      add_dependencies(${R_TARGET} ${t})
    else()
      configure_file("${data}" "${CMAKE_CURRENT_BINARY_DIR}/${data}" COPYONLY)
    endif()
  endforeach()
  set(timeouts small 60 medium 300 large 900 enormous 3600)
  if(NOT R_SIZE)
    set(R_SIZE medium)  # Bazel's default
  endif()
  list(FIND timeouts "${R_SIZE}" i)
  math(EXPR i "${i} + 1")
  list(GET timeouts ${i} timeout)
  _gradsync_package(pkg)
  set(tmp "${PROJECT_BINARY_DIR}/testtmp/${pkg}/${R_NAME}")
  file(MAKE_DIRECTORY "${tmp}")
  get_filename_component(srcdir "${PROJECT_BINARY_DIR}" DIRECTORY)
  get_filename_component(workspace "${PROJECT_BINARY_DIR}" NAME)
  gtest_discover_tests(${R_TARGET}
    TEST_PREFIX "${R_NAME}."
    TEST_LIST ${R_TARGET}_TESTS
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${timeout})
  # List-valued properties do not survive gtest_discover_tests' PROPERTIES
  # (CMake flattens them): set them from a file ctest includes after the
  # discovered tests are defined.
  set(props "${CMAKE_CURRENT_BINARY_DIR}/${R_TARGET}_properties.cmake")
  file(WRITE "${props}"
    "if(${R_TARGET}_TESTS)\n"
    "  set_tests_properties(\${${R_TARGET}_TESTS} PROPERTIES\n"
    "    LABELS [==[${pkg};${R_SIZE}]==]\n"
    "    ENVIRONMENT [==[TEST_SRCDIR=${srcdir};TEST_WORKSPACE=${workspace};TEST_TMPDIR=${tmp}]==])\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${props}")
endfunction()

# C++ messages and gRPC services for .proto files of this folder, generated
# into the build tree at the same relative path as in Bazel's genfiles
# ("proto/gradsync/v1/job.pb.h"): imports resolve against the repository
# root and protobuf's include folder (well-known types).
function(gradsync_cc_grpc_library)
  _gradsync_rule_begin(${ARGN})
  _gradsync_package(pkg)
  set(outs "")
  set(protos "")
  foreach(src IN LISTS R_SRCS)
    string(REGEX REPLACE "\\.proto$" "" base "${PROJECT_BINARY_DIR}/${pkg}/${src}")
    list(APPEND outs "${base}.pb.h" "${base}.pb.cc" "${base}.grpc.pb.h" "${base}.grpc.pb.cc")
    list(APPEND protos "${CMAKE_CURRENT_SOURCE_DIR}/${src}")
  endforeach()
  set(dep_protos "")
  foreach(dep IN LISTS R_DEP_TARGETS)
    get_property(p TARGET ${dep} PROPERTY GRADSYNC_PROTOS)
    list(APPEND dep_protos ${p})
  endforeach()
  add_custom_command(
    OUTPUT ${outs}
    COMMAND "${GRADSYNC_PROTOC}"
      "--proto_path=${PROJECT_SOURCE_DIR}"
      "--proto_path=${GRADSYNC_PROTOBUF_INCLUDE_DIR}"
      "--cpp_out=${PROJECT_BINARY_DIR}"
      "--grpc_out=${PROJECT_BINARY_DIR}"
      "--plugin=protoc-gen-grpc=${GRADSYNC_GRPC_CPP_PLUGIN}"
      ${protos}
    DEPENDS ${protos} ${dep_protos}
    COMMENT "protoc ${pkg}: ${R_SRCS}"
    VERBATIM)
  add_library(${R_TARGET} STATIC ${outs})
  list(FILTER outs INCLUDE REGEX "\\.h$")
  set_property(GLOBAL PROPERTY "GRADSYNC_HDRS_${R_TARGET}" ${outs})
  target_include_directories(${R_TARGET} PUBLIC "${PROJECT_BINARY_DIR}")
  target_link_libraries(${R_TARGET} PUBLIC gradsync_system_grpc ${R_DEP_TARGETS})
  set_property(TARGET ${R_TARGET} PROPERTY GRADSYNC_PROTOS ${protos})
  # Generated code is not ours to warn about.
  target_compile_options(${R_TARGET} PRIVATE -w)
endfunction()
