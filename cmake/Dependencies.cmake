# Third-party dependencies, all from Debian packages (tools/setup.sh).
find_package(Threads REQUIRED)
find_package(gflags REQUIRED)
find_package(glog REQUIRED)
find_package(Gloo REQUIRED)
find_package(Protobuf REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # HMAC-SHA256 for the store's challenge-response
find_package(PkgConfig REQUIRED)
# Intel ISA-L: CRC-32C of TensorBoard records and checkpoint chunks, with the CPU's CRC instructions.
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)
find_package(nlohmann_json 3.11 REQUIRED)  # safetensors headers are JSON
if(TESSEL_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# Debian's Gloo package exports target "gloo" without include directories
# (headers live in /usr/include); give it a namespaced alias for clarity.
if(TARGET gloo AND NOT TARGET Gloo::gloo)
  add_library(Gloo::gloo ALIAS gloo)
endif()
