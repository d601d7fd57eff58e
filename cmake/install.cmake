# cmake/install.cmake — what `cmake --install BUILD --prefix P` puts under P, and the Debian
# package that CPack makes of the same files (`cpack -G DEB` in the build directory):
#   bin/atlas                      the command, with the default model compiled in
#   lib/libatlas.so.A.M.P, .so.A   the shared library: soname libatlas.so.A (A the
#                                  ATLAS_API_VERSION), the file libatlas.so.A.MINOR.PATCH
#   lib/libatlas.so, libatlas.a    for linking, shared or static
#   include/atlas/*.h              the public headers
#   lib/pkgconfig/atlas.pc         pkg-config: -latlas, the include directory, the static deps
#   share/man/man1/atlas.1         the man page (man/atlas.1)
#   share/doc/atlas/               LICENSE (also as Debian's copyright), README.md,
#                                  examples/embed.c
# Included from CMakeLists.txt once every target exists.

include(GNUInstallDirs)

install(TARGETS atlas RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS atlas_shared atlas_lib
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Unspecified
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/atlas DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_SOURCE_DIR}/man/atlas.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE ${CMAKE_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME copyright)
install(FILES ${CMAKE_SOURCE_DIR}/examples/embed.c DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# atlas.pc names the prefix it is installed under: written at install time, when
# CMAKE_INSTALL_PREFIX is --prefix's value (or /usr in CPack's staging for the .deb).  The
# static library needs what the shared one links, named in Libs.private rather than as
# Requires.private, whose Cflags pkg-config would hand to every user of the headers.
# Under a prefix other than /usr (~/.local, /opt/atlas, and /usr/local, whose lib the loader
# finds only after an ldconfig), Libs carries an rpath: a program linked through pkg-config
# finds libatlas.so.A where it was installed, with no LD_LIBRARY_PATH.
set(_atlas_pc_prefix "@CMAKE_INSTALL_PREFIX@") # substituted at install time
set(_atlas_pc_rpath "@ATLAS_PC_RPATH@")
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/atlas.pc.in @ONLY CONTENT [=[
prefix=@_atlas_pc_prefix@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@

Name: atlas
Description: LLM inference engine and OpenAI-compatible server (C API)
Version: @ATLAS_VERSION@
Libs: -L${libdir} @_atlas_pc_rpath@-latlas
Libs.private: -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -ldl -pthread
Cflags: -I${includedir}
]=])
install(CODE "
  if(CMAKE_INSTALL_PREFIX MATCHES \"^/(usr/?)?$\")
    set(ATLAS_PC_RPATH \"\")
  else()
    set(ATLAS_PC_RPATH \"-Wl,-rpath,\\\${libdir} \")
  endif()
  configure_file(\"${CMAKE_BINARY_DIR}/atlas.pc.in\" \"${CMAKE_BINARY_DIR}/atlas.pc\" @ONLY)")
install(FILES ${CMAKE_BINARY_DIR}/atlas.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# --- the Debian package: one package with the command, the libraries and the headers -------
set(CPACK_PACKAGE_NAME atlas)
set(CPACK_PACKAGE_VERSION ${ATLAS_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "LLM inference engine and OpenAI-compatible server (CPU, and CUDA when a driver is there)")
set(ATLAS_PACKAGE_MAINTAINER "atlas maintainers <atlas@localhost>" CACHE STRING
    "The Maintainer field of the Debian package")
set(CPACK_PACKAGE_CONTACT "${ATLAS_PACKAGE_MAINTAINER}")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "atlas runs Hugging Face checkpoints (Llama, Mistral, Qwen) from the command line\n\
and serves them over an OpenAI-compatible HTTP API.  The atlas command carries a\n\
small default model, so `atlas run` works at once.  The package also holds\n\
libatlas (shared and static), its headers and atlas.pc for embedding it.")
# Depends from the binaries' own needs (dpkg-shlibdeps): libc6, libjansson4, libpcre2-8-0,
# libutf8proc2, libmicrohttpd12 (which brings GnuTLS); CUDA is opened at run time, if there.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# A shlibs file and the ldconfig trigger, for the shared library in /usr/lib.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
include(CPack)
