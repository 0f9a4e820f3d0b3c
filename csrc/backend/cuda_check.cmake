# Compile-only check of the backend's CUDA path: cuda_allreduce.cc, cuda_in_flight.cc,
# cuda_work.cc and stragg_backend.cc with -DSTRAGG_BACKEND_CUDA against torch's headers and the
# CUDA toolkit's, never linked (a CPU torch wheel ships the c10/cuda headers but not libc10_cuda).
# Included from kernels/CMakeLists.txt (STRAGG_HAVE_CUDA); object library
# stragg_backend_cuda_check, part of stragg_cuda_check. Works with STRAGG_TORCH=OFF: torch's
# include paths and its _GLIBCXX_USE_CXX11_ABI come from torch.utils.cpp_extension of the
# configuring Python (Python_EXECUTABLE, else python3 on PATH).
if(Python_EXECUTABLE)
  set(_stragg_check_py "${Python_EXECUTABLE}")
else()
  find_program(STRAGG_CHECK_PYTHON NAMES python3 python)
  set(_stragg_check_py "${STRAGG_CHECK_PYTHON}")
endif()
set(_stragg_check_out "")
set(_stragg_check_rc 1)
if(_stragg_check_py)
  execute_process(
    COMMAND "${_stragg_check_py}" -c
            "import torch, torch.utils.cpp_extension as e; print('|'.join(e.include_paths())); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _stragg_check_out RESULT_VARIABLE _stragg_check_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT _stragg_check_rc EQUAL 0)
  message(STATUS "stragg: torch is not importable by '${_stragg_check_py}': the backend's CUDA "
                 "path (csrc/backend/cuda_allreduce.cc, cuda_in_flight.cc, cuda_work.cc) is not "
                 "compile-checked")
  return()
endif()
string(REPLACE "\n" ";" _stragg_check_lines "${_stragg_check_out}")
list(GET _stragg_check_lines -2 _stragg_check_includes)
list(GET _stragg_check_lines -1 _stragg_check_abi)
string(REPLACE "|" ";" _stragg_check_includes "${_stragg_check_includes}")
find_path(STRAGG_CHECK_C10_CUDA_INCLUDE c10/cuda/CUDAStream.h PATHS ${_stragg_check_includes}
          NO_DEFAULT_PATH)
if(NOT STRAGG_CHECK_C10_CUDA_INCLUDE)
  message(STATUS "stragg: torch's headers lack c10/cuda: the backend's CUDA path is not "
                 "compile-checked")
  return()
endif()

add_library(stragg_backend_cuda_check OBJECT EXCLUDE_FROM_ALL
  ${PROJECT_SOURCE_DIR}/csrc/backend/cuda_allreduce.cc
  ${PROJECT_SOURCE_DIR}/csrc/backend/cuda_in_flight.cc
  ${PROJECT_SOURCE_DIR}/csrc/backend/cuda_work.cc
  ${PROJECT_SOURCE_DIR}/csrc/backend/stragg_backend.cc
)
target_include_directories(stragg_backend_cuda_check PRIVATE
  ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/csrc)
target_include_directories(stragg_backend_cuda_check SYSTEM PRIVATE
  ${_stragg_check_includes} ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(stragg_backend_cuda_check PRIVATE
  STRAGG_BACKEND_CUDA _GLIBCXX_USE_CXX11_ABI=${_stragg_check_abi})
# A CPU wheel lacks the generated c10/cuda/impl/cuda_cmake_macros.h (on Linux it only defines
# C10_CUDA_BUILD_SHARED_LIBS, which matters for Windows exports): skip it there.
if(NOT EXISTS "${STRAGG_CHECK_C10_CUDA_INCLUDE}/c10/cuda/impl/cuda_cmake_macros.h")
  target_compile_definitions(stragg_backend_cuda_check PRIVATE C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
endif()
if(STRAGG_HAVE_NCCL)
  target_include_directories(stragg_backend_cuda_check SYSTEM PRIVATE ${STRAGG_NCCL_INCLUDE_DIR})
  target_compile_definitions(stragg_backend_cuda_check PRIVATE STRAGG_BACKEND_NCCL)
endif()
target_compile_options(stragg_backend_cuda_check PRIVATE -Wno-unused-parameter)
add_dependencies(stragg_cuda_check stragg_backend_cuda_check)
message(STATUS "stragg: the backend's CUDA path is compile-checked against torch headers in "
               "${STRAGG_CHECK_C10_CUDA_INCLUDE} (target stragg_backend_cuda_check)")
