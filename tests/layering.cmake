# The floors of DESIGN.md ("Where things live"), checked on the sources:
#  1. every quoted #include of common/, graph/, codelets/ and src/ resolves to a floor it may
#     use (common: include/ and itself; graph: and common/; codelets: include/, common/ and
#     itself; src: all of these), so there is no include circle between folders and codelets/
#     includes nothing from src/;
#  2. no file of common/ or graph/ names starpu.h, starpu_*.h or mpi.h;
#  3. every source of common/ and graph/ compiles with no StarPU or MPI include path
#     (-I include, the generated include folder, common/, graph/ and cJSON's only).
# Run: cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DCC=... -DCJSON_INCLUDE_DIRS=... -P layering.cmake
cmake_minimum_required(VERSION 3.25)
set(allowed_common include common)
set(allowed_graph include common graph)
set(allowed_codelets include common codelets)
set(allowed_src include common graph codelets src)
set(failures "")

# Where a quoted include of a file in folder `dir` resolves: its own folder first, then the
# include directories the build gives (the repository root last).
function(resolve dir name out)
  foreach(base "${dir}" "${SOURCE_DIR}/include" "${BINARY_DIR}/include" "${SOURCE_DIR}/common"
          "${SOURCE_DIR}/graph" "${SOURCE_DIR}/codelets" "${SOURCE_DIR}/src" "${SOURCE_DIR}")
    if(EXISTS "${base}/${name}" AND NOT IS_DIRECTORY "${base}/${name}")
      get_filename_component(full "${base}/${name}" REALPATH)
      set(${out} "${full}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# The floor of a path: include (public and generated headers), common, graph, codelets, src.
function(floor_of path out)
  file(RELATIVE_PATH rel "${SOURCE_DIR}" "${path}")
  if(path MATCHES "^${BINARY_DIR}/include/")
    set(${out} include PARENT_SCOPE)
  elseif(rel MATCHES "^(include|common|graph|codelets|src)/")
    string(REGEX REPLACE "/.*" "" f "${rel}")
    set(${out} ${f} PARENT_SCOPE)
  else()
    set(${out} "other:${rel}" PARENT_SCOPE)
  endif()
endfunction()

foreach(floor common graph codelets src)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${floor}/*.c" "${SOURCE_DIR}/${floor}/*.h"
       "${SOURCE_DIR}/${floor}/*.cu")
  foreach(file IN LISTS files)
    get_filename_component(dir "${file}" DIRECTORY)
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${file}")
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include")
    foreach(line IN LISTS lines)
      if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        set(name "${CMAKE_MATCH_1}")
        resolve("${dir}" "${name}" target)
        if(NOT target)
          list(APPEND failures "${rel}: #include \"${name}\" does not resolve to a file of the tree")
          continue()
        endif()
        floor_of("${target}" to)
        if(NOT to IN_LIST allowed_${floor})
          list(APPEND failures "${rel}: #include \"${name}\" reaches ${to}/, which ${floor}/ may not use")
        endif()
      elseif(line MATCHES "#[ \t]*include[ \t]*<(starpu[^>]*|mpi\\.h)>")
        set(name "${CMAKE_MATCH_1}")
        if(floor STREQUAL "common" OR floor STREQUAL "graph")
          list(APPEND failures "${rel}: includes <${name}>, but ${floor}/ must build without StarPU and MPI")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

# Compile the StarPU-free floors with no StarPU or MPI include path.
file(GLOB pure_sources "${SOURCE_DIR}/common/*.c" "${SOURCE_DIR}/graph/*.c")
set(include_flags -I${SOURCE_DIR}/include -I${BINARY_DIR}/include -I${SOURCE_DIR}/common
    -I${SOURCE_DIR}/graph)
foreach(d IN LISTS CJSON_INCLUDE_DIRS)
  list(APPEND include_flags -I${d})
endforeach()
foreach(src IN LISTS pure_sources)
  file(RELATIVE_PATH rel "${SOURCE_DIR}" "${src}")
  execute_process(COMMAND "${CC}" -std=gnu11 -fsyntax-only ${include_flags} "${src}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(APPEND failures "${rel} does not compile without StarPU/MPI include paths:\n${err}")
  endif()
endforeach()

list(LENGTH failures nfail)
if(nfail)
  string(REPLACE ";" "\n  " text "${failures}")
  message(FATAL_ERROR "layering: ${nfail} problem(s):\n  ${text}")
endif()
message(STATUS "layering: common/, graph/, codelets/ and src/ include only the floors below them")
