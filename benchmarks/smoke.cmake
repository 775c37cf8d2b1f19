# Runs one benchmark binary for the bench_smoke.* tests (benchmarks/CMakeLists.txt): the command
# must exit 0 and its output must match EXPECT, so a benchmark that crashes, refuses its flags or
# stops printing its figures fails the suite. Arguments: -DCMD=<program|arg|arg...> (arguments
# separated by '|') -DEXPECT=<regex>.
string(REPLACE "|" ";" cmd "${CMD}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit status ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "${out}")
