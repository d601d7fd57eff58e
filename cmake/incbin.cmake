# cmake/incbin.cmake — atlas_incbin: the assembler lines and C declaration that embed one file
# in a generated C file's `__asm__` block as hidden symbols SYM[] and SYM_end[] (.rodata, 64-byte
# aligned), shared by the kernels (cmake/kernels.cmake), the chat page (cmake/embed_page.cmake)
# and the default model (cmake/embed_model.cmake).
#
#   atlas_incbin(ASM_VAR DECL_VAR SYM PATH [NUL])
#
# appends to the variables ASM_VAR (string lines for `__asm__(...)`) and DECL_VAR (the extern
# declaration); NUL adds a terminating zero byte (PTX text for cuModuleLoadData), counted
# between SYM and SYM_end.
function(atlas_incbin asm_var decl_var sym path)
  if(path MATCHES "[\"\\\\]")
    message(FATAL_ERROR "atlas: cannot embed ${path}: a quote or backslash in the path")
  endif()
  set(nul "")
  if("NUL" IN_LIST ARGN)
    set(nul "    \".byte 0\\n\"\n")
  endif()
  set(asm "${${asm_var}}")
  string(APPEND asm
    "    \".balign 64\\n\"\n"
    "    \".global ${sym}\\n\"\n"
    "    \".hidden ${sym}\\n\"\n"
    "    \"${sym}:\\n\"\n"
    "    \".incbin \\\"${path}\\\"\\n\"\n"
    "${nul}"
    "    \".global ${sym}_end\\n\"\n"
    "    \".hidden ${sym}_end\\n\"\n"
    "    \"${sym}_end:\\n\"\n")
  set(${asm_var} "${asm}" PARENT_SCOPE)
  set(${decl_var} "${${decl_var}}extern const unsigned char ${sym}[], ${sym}_end[];\n"
      PARENT_SCOPE)
endfunction()
