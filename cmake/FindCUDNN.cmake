# FindCUDNN: locates NVIDIA cuDNN (headers and the shared library), which
# ships no CMake package config. Searches beside the CUDA toolkit when
# find_package(CUDAToolkit) ran before.
#
# Provides the imported target CUDNN::cudnn, and sets CUDNN_FOUND,
# CUDNN_INCLUDE_DIR and CUDNN_LIBRARY. Installed with asgd's package so that
# asgdConfig.cmake can recreate the target its CUDA backend links.

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_INCLUDE_DIR CUDNN_LIBRARY)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
