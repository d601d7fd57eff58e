# cmake/kernels.cmake — the CUDA kernels: every kernels/NAME.cu is compiled by nvcc (one call
# per file, so that the build runs them in parallel) into kernels/NAME.fatbin and, for
# `--kernels portable`, kernels/NAME.ptx; all of them are embedded into the library (a
# generated C file with .incbin; its symbols hidden, so that libatlas.so exports only the
# API): no file is looked up at run time.  The registry loads module NAME with
# cuModuleLoadData; the driver picks the SASS for the device or JIT-compiles the PTX.
#
# ATLAS_CUDA: AUTO (kernels when nvcc is found, also in /usr/local/cuda/bin), ON (nvcc
# required), OFF.  The host code (src/backend/cuda/*.c) is plain C and always builds: it
# loads libcuda at run time.

# Machine code for every NVIDIA GPU from Ampere: A100 (sm_80), RTX 30 / A10 (sm_86), RTX 40 /
# L4 / L40S (sm_89), Hopper (sm_90a), Blackwell B200 (sm_100), RTX 50 (sm_120), GB10 (sm_121),
# and compute_120 PTX that later GPUs JIT-compile.  The kernels need nothing newer than
# mma.sync and cp.async (sm_80); clusters and programmatic dependent launch are used under
# __CUDA_ARCH__ >= 900 and chosen at run time by compute capability (backend/cuda/arch.c).
# The machine codes of one family share a virtual architecture, so that nvcc runs its front
# end once for them (the code differs by no __CUDA_ARCH__ test below 900 or above 1200): a
# third less compile time than a front end per target.
set(ATLAS_CUDA_GENCODE
    "-gencode=arch=compute_80,code=[sm_80,sm_86,sm_89]"
    -gencode=arch=compute_90a,code=sm_90a
    -gencode=arch=compute_100,code=sm_100
    "-gencode=arch=compute_120,code=[sm_120,sm_121,compute_120]"
    CACHE STRING "nvcc -gencode options of the fatbins (e.g. only the GPU at hand, for a quicker build)")
# The portable image of each module: compute_80 PTX alone, which `--kernels portable` loads
# so that the driver compiles it at run time (the nearest an H200 comes to running what an
# RTX card runs: sm_8x machine code cannot run on sm_90).
set(ATLAS_CUDA_PORTABLE_ARCH compute_80)
set(ATLAS_NVCC_FLAGS "" CACHE STRING "Extra flags for nvcc (e.g. -lineinfo)")

set(ATLAS_HAVE_KERNELS OFF)
if(ATLAS_CUDA STREQUAL "OFF")
  message(STATUS "atlas: CUDA kernels: OFF (ATLAS_CUDA=OFF) — the build is CPU-only")
  return()
endif()

# The fatbins hold GPU code only, the same whatever the host CPU: a build for another host (a
# cross build, cmake/aarch64-linux-gnu.cmake) can embed those of an existing build instead of
# compiling them again.  cmake/kernels-prebuilt.sh then stands in for nvcc and copies them.
set(ATLAS_KERNELS_FATBIN_DIR "" CACHE PATH
    "The kernels/ directory of a build that compiled the kernels: embed its files, run no nvcc")
if(ATLAS_KERNELS_FATBIN_DIR)
  get_filename_component(_atlas_prebuilt "${ATLAS_KERNELS_FATBIN_DIR}" ABSOLUTE)
  if(NOT EXISTS ${_atlas_prebuilt}/nvcc-version.txt)
    message(FATAL_ERROR "atlas: ATLAS_KERNELS_FATBIN_DIR=${ATLAS_KERNELS_FATBIN_DIR} has no "
            "nvcc-version.txt: name the kernels/ directory of a build that compiled the kernels")
  endif()
  set(ATLAS_NVCC sh ${CMAKE_CURRENT_LIST_DIR}/kernels-prebuilt.sh ${_atlas_prebuilt})
else()
  find_program(ATLAS_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin
               PATHS /usr/local/cuda/bin /usr/local/cuda)
  if(NOT ATLAS_NVCC)
    if(ATLAS_CUDA STREQUAL "ON")
      message(FATAL_ERROR "atlas: ATLAS_CUDA=ON but nvcc was not found (set CUDA_HOME or PATH)")
    endif()
    message(STATUS "atlas: CUDA kernels: OFF (no nvcc) — the build is CPU-only")
    return()
  endif()
endif()

execute_process(COMMAND ${ATLAS_NVCC} --version OUTPUT_VARIABLE _atlas_nvcc_out
                RESULT_VARIABLE _atlas_nvcc_rc)
if(NOT _atlas_nvcc_rc EQUAL 0 OR NOT _atlas_nvcc_out MATCHES "release ([0-9]+)\\.([0-9]+)")
  message(FATAL_ERROR "atlas: ${ATLAS_NVCC} --version failed or printed no release")
endif()
set(ATLAS_NVCC_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
# Beside the fatbins, for a build that embeds them (ATLAS_KERNELS_FATBIN_DIR).
file(WRITE ${CMAKE_BINARY_DIR}/kernels/nvcc-version.txt "${_atlas_nvcc_out}")
# A driver must support at least this CUDA major version to load the fatbins.
math(EXPR ATLAS_KERNELS_CUDA_VERSION "${CMAKE_MATCH_1} * 1000")

# An older nvcc lacks the newest targets (sm_100 and sm_120 came with CUDA 12.8, sm_121 with
# 12.9): the codes it does not list are left out with a message, where they would fail the
# build, and a -gencode none of whose codes it lists goes whole.
if(NOT ATLAS_KERNELS_FATBIN_DIR)
  execute_process(COMMAND ${ATLAS_NVCC} --list-gpu-arch OUTPUT_VARIABLE _atlas_archs
                  RESULT_VARIABLE _atlas_archs_rc ERROR_QUIET)
  execute_process(COMMAND ${ATLAS_NVCC} --list-gpu-code OUTPUT_VARIABLE _atlas_codes
                  RESULT_VARIABLE _atlas_codes_rc ERROR_QUIET)
  if(_atlas_archs_rc EQUAL 0 AND _atlas_codes_rc EQUAL 0)
    set(_atlas_kept "")
    set(_atlas_dropped "")
    foreach(g ${ATLAS_CUDA_GENCODE})
      if(NOT g MATCHES "^-gencode=arch=(compute_[0-9]+)([a-z]?),code=\\[?([a-z_0-9,]+)\\]?$")
        list(APPEND _atlas_kept ${g}) # a form this does not read: nvcc judges it
        continue()
      endif()
      set(_arch ${CMAKE_MATCH_1})
      set(_suffix ${CMAKE_MATCH_2})
      string(REPLACE "," ";" _want "${CMAKE_MATCH_3}")
      string(FIND "${_atlas_archs}\n" "${_arch}\n" _atlas_at)
      set(_have "")
      foreach(c ${_want})
        string(REGEX REPLACE "[a-z]$" "" _plain "${c}") # sm_90a is listed as sm_90
        string(REGEX REPLACE "^sm_" "compute_" _as_arch "${_plain}")
        if(_atlas_at EQUAL -1)
          set(_found -1)
        elseif(c MATCHES "^compute_")
          string(FIND "${_atlas_archs}\n" "${_as_arch}\n" _found)
        else()
          string(FIND "${_atlas_codes}\n" "${_plain}\n" _found)
        endif()
        if(_found EQUAL -1)
          list(APPEND _atlas_dropped ${c})
        else()
          list(APPEND _have ${c})
        endif()
      endforeach()
      if(_have)
        list(JOIN _have "," _have)
        list(APPEND _atlas_kept "-gencode=arch=${_arch}${_suffix},code=[${_have}]")
      endif()
    endforeach()
    if(_atlas_dropped)
      list(JOIN _atlas_dropped " " _atlas_dropped)
      message(STATUS "atlas: nvcc ${ATLAS_NVCC_VERSION} cannot build ${_atlas_dropped}: left out")
    endif()
    set(ATLAS_CUDA_GENCODE ${_atlas_kept})
  endif()
endif()

file(GLOB ATLAS_KERNEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cu)
file(GLOB ATLAS_KERNEL_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cuh)
list(SORT ATLAS_KERNEL_SOURCES)

set(_atlas_fatbins "")
set(_atlas_asm "")
set(_atlas_decl "")
set(_atlas_fill "")
set(_atlas_n 0)
foreach(cu ${ATLAS_KERNEL_SOURCES})
  get_filename_component(name ${cu} NAME_WE)
  string(MAKE_C_IDENTIFIER "${name}" id)
  set(fatbin ${CMAKE_BINARY_DIR}/kernels/${name}.fatbin)
  add_custom_command(
    OUTPUT ${fatbin}
    COMMAND ${ATLAS_NVCC} -fatbin -O3 -std=c++17 ${ATLAS_CUDA_GENCODE} ${ATLAS_NVCC_FLAGS}
            -o ${fatbin} ${cu}
    DEPENDS ${cu} ${ATLAS_KERNEL_HEADERS}
    COMMENT "nvcc kernels/${name}.cu -> ${name}.fatbin"
    VERBATIM)
  set(ptx ${CMAKE_BINARY_DIR}/kernels/${name}.ptx)
  add_custom_command(
    OUTPUT ${ptx}
    COMMAND ${ATLAS_NVCC} -ptx -O3 -std=c++17 -arch=${ATLAS_CUDA_PORTABLE_ARCH} ${ATLAS_NVCC_FLAGS}
            -o ${ptx} ${cu}
    DEPENDS ${cu} ${ATLAS_KERNEL_HEADERS}
    COMMENT "nvcc kernels/${name}.cu -> ${name}.ptx (${ATLAS_CUDA_PORTABLE_ARCH})"
    VERBATIM)
  list(APPEND _atlas_fatbins ${fatbin} ${ptx})
  atlas_incbin(_atlas_asm _atlas_decl atlas_fatbin_${id} ${fatbin})
  atlas_incbin(_atlas_asm _atlas_decl atlas_ptx_${id} ${ptx} NUL)
  string(APPEND _atlas_fill
    "    table[${_atlas_n}] = (atlas_kernel_image){\"${name}\", atlas_fatbin_${id},\n"
    "        (size_t)(atlas_fatbin_${id}_end - atlas_fatbin_${id}), atlas_ptx_${id},\n"
    "        (size_t)(atlas_ptx_${id}_end - atlas_ptx_${id})};\n")
  math(EXPR _atlas_n "${_atlas_n} + 1")
endforeach()

if(_atlas_n EQUAL 0)
  message(STATUS "atlas: CUDA kernels: OFF (no kernels/*.cu) — the build is CPU-only")
  return()
endif()

# Embedded files taken from ATLAS_KERNELS_FATBIN_DIR are copied again when they change there.
if(ATLAS_KERNELS_FATBIN_DIR)
  foreach(out ${_atlas_fatbins})
    get_filename_component(file ${out} NAME)
    if(NOT EXISTS ${_atlas_prebuilt}/${file})
      message(FATAL_ERROR "atlas: ${_atlas_prebuilt}/${file} is missing: build the kernels "
              "there first (its build's target atlas_kernels)")
    endif()
    add_custom_command(OUTPUT ${out} APPEND DEPENDS ${_atlas_prebuilt}/${file})
  endforeach()
endif()

set(_atlas_embed ${CMAKE_BINARY_DIR}/kernels/atlas_kernels_embed.c)
file(CONFIGURE OUTPUT ${_atlas_embed} @ONLY CONTENT [=[
/* Generated by cmake/kernels.cmake: the kernel fatbins, embedded.  Do not edit. */
#include <pthread.h>
#include <stddef.h>

#include "backend/cuda/registry.h"

__asm__(".section .rodata\n"
@_atlas_asm@    ".previous\n");

@_atlas_decl@
static atlas_kernel_image table[@_atlas_n@];

static void fill(void) {
@_atlas_fill@}

const atlas_kernel_image *atlas_kernel_image_table(int *count) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill);
    *count = @_atlas_n@;
    return table;
}
]=])

# Into the library's objects, so that libatlas.a and libatlas.so both carry the fatbins.
add_custom_target(atlas_kernels DEPENDS ${_atlas_fatbins})
target_sources(atlas_obj PRIVATE ${_atlas_embed})
set_source_files_properties(${_atlas_embed} PROPERTIES OBJECT_DEPENDS "${_atlas_fatbins}")
add_dependencies(atlas_obj atlas_kernels)
target_compile_definitions(atlas_obj PUBLIC ATLAS_HAVE_KERNELS
                           ATLAS_KERNELS_CUDA_VERSION=${ATLAS_KERNELS_CUDA_VERSION})
set(ATLAS_HAVE_KERNELS ON)
message(STATUS "atlas: CUDA kernels: ON (nvcc ${ATLAS_NVCC_VERSION}, ${_atlas_n} module(s))")
