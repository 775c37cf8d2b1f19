# Included from the top level after src/ and kernels/: the command-line tool and the server.
file(GLOB KVSPLIT_CLI_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cli/*.cpp)
add_executable(kvsplit ${KVSPLIT_CLI_SOURCES})
target_link_libraries(kvsplit PRIVATE kvsplit_runtime CLI11::CLI11)

if(KVSPLIT_BUILD_SERVER)
  add_subdirectory(${PROJECT_SOURCE_DIR}/src/server ${PROJECT_BINARY_DIR}/src/server)
endif()
