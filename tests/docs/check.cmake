# Builds the API reference (the docs target) and fails when doxygen finds a public function
# without documentation, or makes no index page. Other doxygen warnings (undocumented
# parameters, struct members) are left in the log and do not fail.
# Variables: BUILD_DIR, DOCS_DIR.
execute_process(COMMAND ${CMAKE_COMMAND} --build "${BUILD_DIR}" --target docs
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the docs target failed (${rc}):\n${out}\n${err}")
endif()
if(NOT EXISTS "${DOCS_DIR}/html/index.html")
  message(FATAL_ERROR "no ${DOCS_DIR}/html/index.html")
endif()
set(log "${DOCS_DIR}/doxygen-warnings.log")
if(NOT EXISTS "${log}")
  message(FATAL_ERROR "doxygen left no warning log ${log}")
endif()
file(STRINGS "${log}" undocumented REGEX "\\(function\\) of file .* is not documented")
if(undocumented)
  list(JOIN undocumented "\n" lines)
  message(FATAL_ERROR "public functions without documentation:\n${lines}")
endif()
file(STRINGS "${log}" warnings)
list(LENGTH warnings count)
message(STATUS "API reference: ${DOCS_DIR}/html/index.html (${count} other warning lines in ${log})")
