# cmake/aarch64-linux-gnu.cmake — cross-compile atlas for 64-bit Arm Linux (Grace, GB10) on
# an x86_64 Debian host: Debian's cross compiler (gcc-aarch64-linux-gnu) and the arm64
# multiarch -dev packages (dpkg --add-architecture arm64; libjansson-dev:arm64 ...).
# scripts/cross-aarch64.sh installs them, builds and runs the CPU tests under qemu-user.
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DATLAS_KERNELS_FATBIN_DIR=build/kernels     # the GPU kernels of an x86 build
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(ATLAS_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${ATLAS_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${ATLAS_CROSS_TRIPLE}-g++)

# Headers and libraries of the target only; programs (python3, node, nvcc) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${ATLAS_CROSS_TRIPLE})
set(CMAKE_LIBRARY_ARCHITECTURE ${ATLAS_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config reads the arm64 .pc files only (the host's would link x86_64 libraries).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${ATLAS_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")

# ctest runs the test programs through qemu-user.  With the loader and libc of the arm64
# multiarch libc6, which the -dev:arm64 packages' libraries come with: the cross toolchain's
# (-L /usr/aarch64-linux-gnu) may be another build of glibc, and a loader and libc of two
# builds disagree on the loader's internals (pthread_create then loops forever).
find_program(ATLAS_QEMU_AARCH64 qemu-aarch64)
if(ATLAS_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ATLAS_QEMU_AARCH64})
endif()
