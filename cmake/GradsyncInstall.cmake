# Installs the public library as the CMake package "gradsync", for users'
# own LibTorch training loops:
#
#   cmake --install build/cmake --prefix /opt/gradsync --component gradsync
#   # in the user's CMakeLists.txt:
#   find_package(gradsync REQUIRED)       # CMAKE_PREFIX_PATH=/opt/gradsync
#   target_link_libraries(my_trainer PRIVATE gradsync::gradsync)
#
# It installs lib/libgradsync.so (every object of //gradsync and the gradsync
# libraries it depends on), their headers under include/gradsync/ at their
# repository paths ("gradsync/ddp.h", "worker/ddp/reducer.h", and the
# generated "proto/..." ones), and lib/cmake/gradsync/gradsyncConfig.cmake,
# which finds LibTorch and abseil as this build did and defines the imported
# target gradsync::gradsync. Called from the top CMakeLists.txt once every
# folder is added; does nothing without LibTorch.

include_guard(GLOBAL)

# The gradsync targets `target` depends on, transitively (not the
# //third_party/system ones), into `out`.
function(_gradsync_internal_closure target out)
  get_property(refs GLOBAL PROPERTY GRADSYNC_REFERENCES)
  set(found "")
  set(todo "${target}")
  while(todo)
    list(POP_FRONT todo t)
    if(t IN_LIST found)
      continue()
    endif()
    list(APPEND found "${t}")
    foreach(ref IN LISTS refs)
      if(ref MATCHES "^${t}>(.+)$")
        set(dep "${CMAKE_MATCH_1}")  # before another MATCHES resets it
        if(NOT dep MATCHES "^gradsync_system_")
          list(APPEND todo "${dep}")
        endif()
      endif()
    endforeach()
  endwhile()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# What users' code links beside libgradsync.so: the abseil and LibTorch the
# public headers use, as this build found them.
function(_gradsync_user_link_libraries out)
  set(libs "")
  if(absl_FOUND)
    foreach(name IN LISTS _gradsync_absl_libs)
      if(TARGET absl::${name})
        list(APPEND libs "absl::${name}")
      endif()
    endforeach()
  else()
    foreach(name IN LISTS _gradsync_absl_libs)
      list(APPEND libs "${GRADSYNC_LIB_absl_${name}}")
    endforeach()
  endif()
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

function(gradsync_install_package)
  if(NOT TARGET gradsync_gradsync)
    message(STATUS "gradsync: no package to install (the library needs LibTorch)")
    return()
  endif()
  _gradsync_internal_closure(gradsync_gradsync internal)

  # One shared library holding every object of the closure.
  set(archives "")
  foreach(t IN LISTS internal)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "STATIC_LIBRARY")
      list(APPEND archives "$<TARGET_FILE:${t}>")
    endif()
  endforeach()
  file(WRITE "${PROJECT_BINARY_DIR}/gradsync_shared.cc"
       "// libgradsync.so: its objects come whole from the static libraries.\n")
  add_library(gradsync_shared SHARED "${PROJECT_BINARY_DIR}/gradsync_shared.cc")
  set_target_properties(gradsync_shared PROPERTIES OUTPUT_NAME gradsync)
  target_link_libraries(gradsync_shared PRIVATE
    -Wl,--whole-archive ${archives} -Wl,--no-whole-archive gradsync_gradsync)
  install(TARGETS gradsync_shared LIBRARY DESTINATION lib COMPONENT gradsync)

  # The closure's headers, at their repository (or generated) paths.
  foreach(t IN LISTS internal)
    get_property(hdrs GLOBAL PROPERTY "GRADSYNC_HDRS_${t}")
    foreach(h IN LISTS hdrs)
      # Generated headers by their path in the build tree (which may sit
      # inside the source tree), the others by theirs in the source tree.
      string(FIND "${h}" "${PROJECT_BINARY_DIR}/" in_build)
      if(in_build EQUAL 0)
        file(RELATIVE_PATH rel "${PROJECT_BINARY_DIR}" "${h}")
      else()
        file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${h}")
      endif()
      get_filename_component(dir "${rel}" DIRECTORY)
      install(FILES "${h}" DESTINATION "include/gradsync/${dir}" COMPONENT gradsync)
    endforeach()
  endforeach()

  _gradsync_user_link_libraries(GRADSYNC_USER_LIBS)
  set(GRADSYNC_TORCH_DIR "${Torch_DIR}")
  set(GRADSYNC_ABSL_CONFIG "${absl_FOUND}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/gradsyncConfig.cmake.in"
                 "${PROJECT_BINARY_DIR}/gradsyncConfig.cmake" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/gradsyncConfig.cmake"
          DESTINATION lib/cmake/gradsync COMPONENT gradsync)
endfunction()
