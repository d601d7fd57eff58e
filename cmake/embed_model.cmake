# cmake/embed_model.cmake — the default model (models/default) compiled into the atlas
# command: a generated C file embeds each of its files with .incbin and hands them out as an
# atlas_memdir_file table (include/atlas/memdir.h), which src/cli/default_model.c registers
# as an in-memory model directory.  So `atlas run` needs no file at run time; the bytes make
# the binary about 14 MB bigger.  Only the files a load reads are embedded (not the README,
# the training log or the test references).
#
# Included from CMakeLists.txt after the atlas target exists.

set(ATLAS_DEFAULT_MODEL_DIR ${CMAKE_SOURCE_DIR}/models/default)
set(ATLAS_DEFAULT_MODEL_FILES config.json generation_config.json tokenizer.json
    tokenizer_config.json model.safetensors)

set(_atlas_asm "")
set(_atlas_decl "")
set(_atlas_rows "")
set(_atlas_deps "")
set(_atlas_i 0)
foreach(name ${ATLAS_DEFAULT_MODEL_FILES})
  set(path ${ATLAS_DEFAULT_MODEL_DIR}/${name})
  if(NOT EXISTS ${path})
    message(FATAL_ERROR "atlas: the default model's ${path} is missing")
  endif()
  set(sym atlas_default_model_${_atlas_i})
  atlas_incbin(_atlas_asm _atlas_decl ${sym} ${path})
  string(APPEND _atlas_rows
    "    files[${_atlas_i}] = (atlas_memdir_file){\"${name}\", ${sym}, (size_t)(${sym}_end - ${sym})};\n")
  list(APPEND _atlas_deps ${path})
  math(EXPR _atlas_i "${_atlas_i} + 1")
endforeach()

atlas_embed_table(${CMAKE_BINARY_DIR}/default_model_embed.c atlas "models/default (cmake/embed_model.cmake)" cli/default_model.h atlas_memdir_file atlas_cli_embedded_files
                  "${_atlas_asm}" "${_atlas_decl}" "${_atlas_rows}" ${_atlas_i} "${_atlas_deps}")
