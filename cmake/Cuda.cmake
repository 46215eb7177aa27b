# Decides whether the CUDA backend is built (ASGD_WITH_CUDA = ON | OFF | AUTO)
# and sets ASGD_CUDA_ENABLED. AUTO turns it on where nvcc, the CUDA toolkit
# and cuDNN are all found; ON makes their absence a configuration error.
set(ASGD_CUDA_ENABLED OFF)
string(TOUPPER "${ASGD_WITH_CUDA}" _asgd_cuda_mode)
if(NOT _asgd_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  set(_asgd_cuda_ok OFF)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
    find_package(CUDNN QUIET)
    if(CUDAToolkit_FOUND AND CUDNN_FOUND)
      set(_asgd_cuda_ok ON)
    endif()
  endif()
  if(_asgd_cuda_ok)
    set(ASGD_CUDA_ENABLED ON)
    # What compute/cuda/ compiles and links against. The library is an
    # imported target, not a path, so the installed package's export names
    # no file of this machine (asgdConfig.cmake finds cuDNN again).
    set(ASGD_CUDNN_INCLUDE_DIR ${CUDNN_INCLUDE_DIR})
    set(ASGD_CUDNN_LIBRARY CUDNN::cudnn)
    # Link the shared CUDA runtime only; libcuda comes from the driver at run
    # time and is never linked (build machines only have a stub).
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
  elseif(_asgd_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "ASGD_WITH_CUDA=ON but nvcc, the CUDA toolkit or cuDNN was not found")
  endif()
endif()
