# Runs one benchmark binary for the bench_smoke.* tests (benchmarks/CMakeLists.txt): the command
# must exit 0 and its output must match EXPECT, so a benchmark that crashes, refuses its flags or
# stops printing its figures fails the suite. Arguments: -DCMD=<program|arg|arg...> (arguments
# separated by '|') -DEXPECT=<regex> [-DRC=<code>].
string(REPLACE "|" ";" cmd "${CMD}")
# -DRC=<code> expects that exit status instead of 0, and EXPECT then matches stderr: a bad flag
# must exit 2 with a message naming it.
if(NOT DEFINED RC)
  set(RC 0)
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${RC}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT RC EQUAL 0)
  set(out "${err}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "${out}")
