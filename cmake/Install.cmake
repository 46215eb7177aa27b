# `cmake --install` rules: libasgd.a with the public headers (include/asgd/),
# the asgd command line, and a relocatable CMake package, so that another
# project writes
#
#   find_package(asgd CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE asgd::asgd)
#
# The library is static, so its dependencies are linked by the consumer:
# asgdConfig.cmake finds each again (see asgdConfig.cmake.in) and the export
# refers to them by target name only, never by a path of the build machine.
include(CMakePackageConfigHelpers)

set(ASGD_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/asgd)

install(TARGETS asgd_lib EXPORT asgdTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
if(TARGET asgd_cuda)
  # The CUDA backend's plugin (compute/cuda_backend.hpp), beside libasgd.a,
  # where the CLI (../lib from bin/) and a consumer (its run path, from
  # asgdConfig.cmake) find it; it keeps its run path to the CUDA toolkit.
  set_target_properties(asgd_cuda PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS asgd_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/asgd
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
# The installed CLI keeps the run path to libraries outside the system's
# directories (the CUDA toolkit's), never one into this build.
# asgd-bench goes beside asgd, where `asgd bench` looks for it.
set(_asgd_programs asgd)
if(TARGET asgd-bench)
  list(APPEND _asgd_programs asgd-bench)
endif()
set_target_properties(${_asgd_programs} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS ${_asgd_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

install(EXPORT asgdTargets NAMESPACE asgd:: FILE asgdTargets.cmake
  DESTINATION ${ASGD_INSTALL_CMAKEDIR} COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/asgdConfig.cmake.in
  ${CMAKE_BINARY_DIR}/asgdConfig.cmake
  INSTALL_DESTINATION ${ASGD_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
# 0.x: a minor version may break the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/asgdConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_BINARY_DIR}/asgdConfig.cmake ${CMAKE_BINARY_DIR}/asgdConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/FindCAF.cmake
  DESTINATION ${ASGD_INSTALL_CMAKEDIR} COMPONENT development)
