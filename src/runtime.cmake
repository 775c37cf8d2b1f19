# Included from the top level after src/ and kernels/: the backend registry (which knows the CUDA
# backend when it is built), the command-line tool and the server.
add_library(kvsplit_runtime STATIC ${PROJECT_SOURCE_DIR}/src/backend/registry/registry.cpp)
target_link_libraries(kvsplit_runtime PUBLIC kvsplit_core)
if(TARGET kvsplit_cuda)
  target_link_libraries(kvsplit_runtime PUBLIC kvsplit_cuda)
  target_compile_definitions(kvsplit_runtime PRIVATE KVSPLIT_HAVE_CUDA_BACKEND=1)
endif()

file(GLOB KVSPLIT_CLI_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cli/*.cpp)
if(KVSPLIT_CLI_SOURCES)
  add_executable(kvsplit ${KVSPLIT_CLI_SOURCES})
  target_link_libraries(kvsplit PRIVATE kvsplit_runtime CLI11::CLI11)
endif()

if(KVSPLIT_BUILD_SERVER AND EXISTS ${PROJECT_SOURCE_DIR}/src/server/CMakeLists.txt)
  add_subdirectory(${PROJECT_SOURCE_DIR}/src/server ${PROJECT_BINARY_DIR}/src/server)
endif()
# The engine (in kvsplit_core) creates its workers' backends through create_backend(), which
# lives here: a circular static dependency CMake resolves by repeating the archives.
target_link_libraries(kvsplit_core INTERFACE kvsplit_runtime)
