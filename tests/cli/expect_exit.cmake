# Run COMMAND (a ;-list) and require exit code EXPECT and, if given, MATCH in its output.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT}: ${COMMAND}\n${out}\n${err}")
endif()
if(DEFINED MATCH AND NOT "${out}${err}" MATCHES "${MATCH}")
  message(FATAL_ERROR "output lacks '${MATCH}':\n${out}\n${err}")
endif()
