# Resolves STRAGG_CUDA=auto|on|off (included from the top-level CMakeLists.txt).
#
# Sets STRAGG_HAVE_CUDA (build kernels/ and tests/gpu/) and STRAGG_HAVE_NCCL (NCCL headers found:
# build the NCCL point-to-point layer), plus STRAGG_NCCL_INCLUDE_DIR / STRAGG_NCCL_LIBRARY.
#   auto: build the CUDA parts when a CUDA compiler is found (nvcc on PATH, or CUDACXX).
#   on:   the same, but fail when the CUDA compiler or the NCCL headers are missing.
#   off:  never.
# NCCL comes from the nvidia-nccl-cu13 wheel of the configuring Python (Python_EXECUTABLE, else
# python3 on PATH), from NCCL_HOME / NCCL_ROOT, or from the system include paths;
# -DSTRAGG_NCCL_INCLUDE_DIR=... overrides the search.
#
# Also declares STRAGG_BACKEND_CUDA=auto|on|off: route all_reduce on CUDA tensors in stragg._C to
# stragg's GPU executor (csrc/backend/cuda_allreduce.cc) instead of the inner NCCL backend.
# Resolved in csrc/backend/CMakeLists.txt once torch is found: auto = on when STRAGG_HAVE_CUDA and
# torch was built with CUDA (it provides c10_cuda); on = the same, but fail when either is missing.
set(STRAGG_BACKEND_CUDA "auto" CACHE STRING
    "all_reduce on CUDA tensors on stragg's GPU executor in stragg._C: auto|on|off")
set(STRAGG_HAVE_CUDA OFF)
set(STRAGG_HAVE_NCCL OFF)
string(TOLOWER "${STRAGG_CUDA}" _stragg_cuda_mode)
if(NOT _stragg_cuda_mode MATCHES "^(auto|on|off)$")
  message(FATAL_ERROR "STRAGG_CUDA must be auto, on or off (got '${STRAGG_CUDA}')")
endif()
if(_stragg_cuda_mode STREQUAL "off")
  message(STATUS "stragg: CUDA parts disabled (STRAGG_CUDA=off)")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(_stragg_cuda_mode STREQUAL "on")
    message(FATAL_ERROR "STRAGG_CUDA=on but no CUDA compiler was found: put nvcc on PATH or set "
                        "CUDACXX=/path/to/nvcc (or configure with -DSTRAGG_CUDA=off)")
  endif()
  message(STATUS "stragg: no CUDA compiler found, GPU parts not built (STRAGG_CUDA=auto)")
  return()
endif()

# Ampere (A100) and Hopper (H100/H200) SASS; override with -DCMAKE_CUDA_ARCHITECTURES=...
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)
set(STRAGG_HAVE_CUDA ON)
message(STATUS "stragg: CUDA ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}), "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}")

# NCCL headers (and library, needed only to link executables).
set(_stragg_nccl_hints "")
foreach(_root "$ENV{NCCL_HOME}" "$ENV{NCCL_ROOT}")
  if(_root)
    list(APPEND _stragg_nccl_hints "${_root}")
  endif()
endforeach()
if(Python_EXECUTABLE)
  set(_stragg_py "${Python_EXECUTABLE}")
else()
  find_program(STRAGG_NCCL_PYTHON NAMES python3 python)
  set(_stragg_py "${STRAGG_NCCL_PYTHON}")
endif()
if(_stragg_py)
  execute_process(
    COMMAND "${_stragg_py}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _stragg_wheel_nccl OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _stragg_wheel_rc ERROR_QUIET)
  if(_stragg_wheel_rc EQUAL 0 AND _stragg_wheel_nccl)
    list(APPEND _stragg_nccl_hints "${_stragg_wheel_nccl}")
  endif()
endif()
find_path(STRAGG_NCCL_INCLUDE_DIR nccl.h
          HINTS ${_stragg_nccl_hints} PATH_SUFFIXES include
          PATHS "${CUDAToolkit_INCLUDE_DIRS}")
find_library(STRAGG_NCCL_LIBRARY NAMES nccl libnccl.so.2
             HINTS ${_stragg_nccl_hints} PATH_SUFFIXES lib lib64
             PATHS "${CUDAToolkit_LIBRARY_DIR}")
if(STRAGG_NCCL_INCLUDE_DIR)
  set(STRAGG_HAVE_NCCL ON)
  message(STATUS "stragg: NCCL headers ${STRAGG_NCCL_INCLUDE_DIR}, library "
                 "${STRAGG_NCCL_LIBRARY}")
else()
  string(CONCAT _stragg_nccl_msg
      "NCCL headers (nccl.h) not found. Install them into the configuring Python with "
      "'${_stragg_py} -m pip install nvidia-nccl-cu13==2.32.3', or pass "
      "-DSTRAGG_NCCL_INCLUDE_DIR=/path/to/include (or set NCCL_HOME)")
  if(_stragg_cuda_mode STREQUAL "on")
    message(FATAL_ERROR "stragg: STRAGG_CUDA=on: ${_stragg_nccl_msg}")
  endif()
  message(WARNING "stragg: ${_stragg_nccl_msg}; building the GPU parts without the NCCL layer")
endif()
