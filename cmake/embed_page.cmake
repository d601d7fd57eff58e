# cmake/embed_page.cmake — the chat page (web/) compiled into the library: a generated C file
# embeds each file with .incbin and hands them out as an atlas_page_file table with an ETag
# made of its SHA-256 (src/server/page.h), so the server needs no file at run time and a
# browser revalidates its copy cheaply. An edit of a page file re-runs this configure step
# (the ETags change with the bytes).
#
# Included from CMakeLists.txt after atlas_obj and cmake/incbin.cmake.

set(ATLAS_PAGE_DIR ${CMAKE_SOURCE_DIR}/web)
set(ATLAS_PAGE_FILES index.html chat.css chat.js)

set(_atlas_asm "")
set(_atlas_decl "")
set(_atlas_rows "")
set(_atlas_deps "")
set(_atlas_i 0)
foreach(name ${ATLAS_PAGE_FILES})
  set(path ${ATLAS_PAGE_DIR}/${name})
  if(NOT EXISTS ${path})
    message(FATAL_ERROR "atlas: the chat page's ${path} is missing")
  endif()
  file(SHA256 ${path} _atlas_hash)
  string(SUBSTRING ${_atlas_hash} 0 20 _atlas_hash)
  set(sym atlas_page_file_${_atlas_i})
  atlas_incbin(_atlas_asm _atlas_decl ${sym} ${path})
  string(APPEND _atlas_rows
    "    files[${_atlas_i}] = (atlas_page_file){\"${name}\", \"\\\"${_atlas_hash}\\\"\", ${sym}, (size_t)(${sym}_end - ${sym})};\n")
  list(APPEND _atlas_deps ${path})
  math(EXPR _atlas_i "${_atlas_i} + 1")
endforeach()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_atlas_deps})

atlas_embed_table(${CMAKE_BINARY_DIR}/page_embed.c atlas_obj "web/ (cmake/embed_page.cmake)" server/page.h atlas_page_file atlas_page_files
                  "${_atlas_asm}" "${_atlas_decl}" "${_atlas_rows}" ${_atlas_i} "${_atlas_deps}")
