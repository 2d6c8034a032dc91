# FindCUDNN: NVIDIA cuDNN, header cudnn.h and library libcudnn.
#
# Looks under CUDNN_ROOT (a CMake or environment variable), then the CUDA toolkit's folders
# (CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR when find_package(CUDAToolkit) ran first),
# then /usr/local/cuda, then the system's default paths.
#
# Sets CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION (from cudnn_version.h, or
# cudnn.h for cuDNN before 8) and CUDNN_HEADER_ONLY (TRUE when cudnn.h was found but no
# libcudnn: a toolkit with cuDNN's headers and without its library; CUDNN_FOUND is then FALSE),
# and the imported target CUDNN::cudnn.
include(FindPackageHandleStandardArgs)

set(_cudnn_hints "")
foreach(_root "${CUDNN_ROOT}" "$ENV{CUDNN_ROOT}")
  if(_root)
    list(APPEND _cudnn_hints "${_root}")
  endif()
endforeach()
list(APPEND _cudnn_hints /usr/local/cuda)

find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY cudnn
  HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x64)

set(CUDNN_VERSION "")
if(CUDNN_INCLUDE_DIR)
  set(_cudnn_version_header "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  if(NOT EXISTS "${_cudnn_version_header}")
    set(_cudnn_version_header "${CUDNN_INCLUDE_DIR}/cudnn.h")
  endif()
  file(STRINGS "${_cudnn_version_header}" _cudnn_version_lines
       REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX REPLACE ".*#define CUDNN_${_part} +([0-9]+).*" "\\1" _cudnn_${_part}
           "${_cudnn_version_lines}")
  endforeach()
  if(_cudnn_MAJOR MATCHES "^[0-9]+$")
    set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
  endif()
endif()

set(CUDNN_HEADER_ONLY FALSE)
if(CUDNN_INCLUDE_DIR AND NOT CUDNN_LIBRARY)
  set(CUDNN_HEADER_ONLY TRUE)
  if(NOT CUDNN_FIND_QUIETLY)
    message(STATUS "cuDNN: headers found in ${CUDNN_INCLUDE_DIR} but no libcudnn "
                   "(set CUDNN_ROOT to a cuDNN installation with its library)")
  endif()
endif()

find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()

mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
