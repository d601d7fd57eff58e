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
    ENVIRONMENT "ATLAS_BIN=${ATLAS_TEST_BIN};ATLAS_TEST_DATA=${CMAKE_SOURCE_DIR}/tests/data;ATLAS_OLD_LIBCUDA=$<TARGET_FILE:old_libcuda>")
endforeach()
# server-slow asserts an answer within a second under 1,000 slow connections: under `ctest -j`
# it runs alone, so that a neighbour's load cannot make it fail.
if(TEST server-slow)
  set_tests_properties(server-slow PROPERTIES RUN_SERIAL TRUE)
endif()
# server-preflight asserts that a taken port fails the start within a second: alone too.
if(TEST server-preflight)
  set_tests_properties(server-preflight PROPERTIES RUN_SERIAL TRUE)
endif()

# The small-width conformance set (tools/conformance/shapes.py SMALL; checkpoints and
# transformers' references made on a GPU machine by tools/conformance/make.py --set small):
# every model through the engine on the CPU, prompts longer than a step's 16 tokens, forced
# decode steps, each of atlas's top 8 log-probs within 2e-3 of the reference's.
file(GLOB ATLAS_SMALL_MODELS LIST_DIRECTORIES true ${CMAKE_SOURCE_DIR}/tests/data/small/*)
if(ATLAS_SMALL_MODELS)
  add_test(NAME small-refs COMMAND atlas-conform --device cpu --bound 2e-3 --batch-tokens 16
           --parallel 4 ${ATLAS_SMALL_MODELS})
  set_tests_properties(small-refs PROPERTIES LABELS cpu TIMEOUT 300)
  # the same with bf16 activations (--cpu-activations bf16) held to the GPU's bound; gpt-oss's
  # small shapes are left out: their random weights give 6e-2 to 1.3e-1 there (bench/RESULTS.md)
  set(ATLAS_SMALL_BF16 ${ATLAS_SMALL_MODELS})
  list(FILTER ATLAS_SMALL_BF16 EXCLUDE REGEX "/gpt-oss")
  add_test(NAME small-refs-bf16 COMMAND atlas-conform --device cpu --cpu-activations bf16
           --bound 5e-2 --batch-tokens 16 --parallel 4 ${ATLAS_SMALL_BF16})
  set_tests_properties(small-refs-bf16 PROPERTIES LABELS cpu TIMEOUT 300)
  # with an FP8 KV cache, against the references transformers made with K and V rounded as
  # the cache rounds them (tools/conformance/make.py --kv fp8: reference-kvfp8.safetensors),
  # for the models that have them. Bound 2e-2: a K or V value that fp32 summation order puts
  # on the other side of an e4m3 rounding boundary changes by a whole code step, which moves
  # a logprob by up to 4e-3 on these shapes with the AVX-512 kernels (qwen3-moe at 40 and 63
  # tokens) and by 1.6e-2 with the AVX2 ones (gemma3 at 200 tokens, one position; every
  # other cell under 4e-3 on both); a wrong scale or layout moves 1e-1 and more
  file(GLOB ATLAS_SMALL_KVFP8 ${CMAKE_SOURCE_DIR}/tests/data/small/*/reference-kvfp8.safetensors)
  if(ATLAS_SMALL_KVFP8)
    set(ATLAS_SMALL_KVFP8_DIRS)
    foreach(f ${ATLAS_SMALL_KVFP8})
      get_filename_component(d ${f} DIRECTORY)
      list(APPEND ATLAS_SMALL_KVFP8_DIRS ${d})
    endforeach()
    add_test(NAME small-refs-kvfp8 COMMAND atlas-conform --device cpu --kv-cache-dtype fp8
             --bound 2e-2 --batch-tokens 16 --parallel 4 ${ATLAS_SMALL_KVFP8_DIRS})
    set_tests_properties(small-refs-kvfp8 PROPERTIES LABELS cpu TIMEOUT 300)
  endif()
  # the same prompts through atlas serve, 8 requests at once a model (no teacher forcing: a
  # position is compared while atlas's greedy tokens before it are the reference's)
  add_test(NAME small-refs-serve
           COMMAND sh ${CMAKE_SOURCE_DIR}/bench/conformance/serve_local.sh ${ATLAS_TEST_BIN}
           2e-3 ${ATLAS_SMALL_MODELS})
  set_tests_properties(small-refs-serve PROPERTIES LABELS cpu TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "SERVE_ARGS=--device cpu --cpu-activations fp32 --batch-tokens 16 --parallel 8")
endif()

# The house rules (tools/layers.py): no include or call to a higher layer, no cycle of files
# calling each other, front ends on the public headers only; read from this build's objects.
find_program(ATLAS_PYTHON3 python3)
if(ATLAS_PYTHON3)
  add_test(NAME layers COMMAND ${ATLAS_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/layers.py
           ${CMAKE_BINARY_DIR})
  set_tests_properties(layers PROPERTIES LABELS cpu TIMEOUT 120)
  # bench/gpu/families.sh's checkpoints: every published shape's tensors as atlas loads them,
  # and the active bytes a token its table computes equal to atlas's (sparse files, seconds)
  add_test(NAME bench-checkpoints COMMAND ${ATLAS_PYTHON3}
           ${CMAKE_SOURCE_DIR}/tests/bench/checkpoints.py $<TARGET_FILE:atlas>)
  set_tests_properties(bench-checkpoints PROPERTIES LABELS cpu TIMEOUT 120)
else()
  message(WARNING "atlas: no python3: the layers check (tools/layers.py) is not registered")
endif()

# README.md followed as written (tests/readme/walk.sh): its marked blocks run in order against
# this build's atlas (export, run, serve in the background, chat, curl, the Node OpenAI SDK, a
# swap), in a network namespace of their own; about 5 s. The GPU blocks only in
# readme-walk-gpu. Not under an emulator (a cross build): the server there would run for
# minutes under qemu-user and test nothing a native walk does not.
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
  add_test(NAME readme-walk COMMAND bash ${CMAKE_SOURCE_DIR}/tests/readme/walk.sh
           $<TARGET_FILE:atlas>)
  set_tests_properties(readme-walk PROPERTIES LABELS cpu TIMEOUT 120 SKIP_RETURN_CODE 77)
  add_test(NAME readme-walk-gpu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/readme/walk.sh --gpu
           $<TARGET_FILE:atlas>)
  set_tests_properties(readme-walk-gpu PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
