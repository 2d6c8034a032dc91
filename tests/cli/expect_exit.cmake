# Run COMMAND (a ;-list) and require exit code EXPECT and, if given, MATCH in its output and
# NOT_MATCH nowhere in it.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT}: ${COMMAND}\n${out}\n${err}")
endif()
if(DEFINED MATCH AND NOT "${out}${err}" MATCHES "${MATCH}")
  message(FATAL_ERROR "output lacks '${MATCH}':\n${out}\n${err}")
endif()
if(NOT "${NOT_MATCH}" STREQUAL "" AND "${out}${err}" MATCHES "${NOT_MATCH}")
  message(FATAL_ERROR "output has '${NOT_MATCH}':\n${out}\n${err}")
endif()
