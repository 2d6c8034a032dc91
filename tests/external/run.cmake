# Install the built tessel into a fresh prefix, check that the installed tool starts from it
# without LD_LIBRARY_PATH (install RPATH) and that the model files, guides and license are
# there, then configure, build and run a separate project against it twice: once through
# find_package(tessel), once through tessel.pc alone; both in strict ISO C11, the mode that
# needs what the package carries for StarPU's headers.
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/tessel/tessel.h include/tessel/export.h include/tessel/version.h
          lib/cmake/tessel/tesselConfig.cmake bin/tessel share/tessel/models/cnn.json
          share/tessel/models/unet3d.json share/tessel/docs/model-format.md
          share/doc/tessel/LICENSE)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install lacks ${f}")
  endif()
endforeach()

# 0. The installed tool, with no LD_LIBRARY_PATH: finds libtessel through its RPATH.
run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${prefix}/bin/tessel" --version)
if(NOT out MATCHES "tessel [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "installed 'tessel --version' printed: ${out}")
endif()

# 1. CMake package.
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/consumer" -B "${WORK_DIR}/cmake-build"
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/cmake-build")
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${prefix}/lib "${WORK_DIR}/cmake-build/consumer")

# 2. pkg-config.
find_program(PKG_CONFIG pkg-config REQUIRED)
find_program(CC NAMES cc gcc REQUIRED)
execute_process(COMMAND ${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${prefix}/lib/pkgconfig:$ENV{PKG_CONFIG_PATH}"
                ${PKG_CONFIG} --cflags --libs tessel
                RESULT_VARIABLE rc OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not find tessel.pc")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c11 "${SOURCE_DIR}/consumer/main.c" -o "${WORK_DIR}/pc-consumer" ${flags})
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${prefix}/lib "${WORK_DIR}/pc-consumer")
