# tests/scripts.cmake — script tests (included by CMakeLists.txt): the server driven over
# real sockets by the official OpenAI Node SDK (tests/server/*.test.mjs, one ctest each).
# They need node and tests/server/node_modules (scripts/setup.sh runs npm install there);
# without them they report SKIP (exit 77), never a silent pass.
find_program(ATLAS_NODE node)
file(GLOB ATLAS_SERVER_SCRIPT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/server/*.test.mjs)
foreach(script ${ATLAS_SERVER_SCRIPT_TESTS})
  get_filename_component(stem ${script} NAME_WE)
  set(name "server-${stem}")
  add_test(NAME ${name}
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/server/run.sh ${script}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests/server)
  set_tests_properties(${name} PROPERTIES LABELS cpu TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "ATLAS_BIN=$<TARGET_FILE:atlas>;ATLAS_TEST_DATA=${CMAKE_SOURCE_DIR}/tests/data")
endforeach()
