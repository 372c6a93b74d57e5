# Installs the libraries, public headers, tools and a CMake package config so
# that another project can `find_package(tessel)` and link `tessel::tessel`.
include(CMakePackageConfigHelpers)

set(TESSEL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)

install(EXPORT tesselTargets
        NAMESPACE tessel::
        DESTINATION ${TESSEL_CMAKE_DIR})

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/tesselConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tesselConfig.cmake
  INSTALL_DESTINATION ${TESSEL_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/tesselConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tesselConfig.cmake
              ${PROJECT_BINARY_DIR}/tesselConfigVersion.cmake
        DESTINATION ${TESSEL_CMAKE_DIR})

install(FILES include/tessel/tessel.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessel)
