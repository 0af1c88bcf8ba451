# Finds Debian's libblis-dev (BLIS 0.9; no pkg-config file or CMake
# package). Debian installs each threading flavour in its own directory;
# the OpenMP one is taken first, as oneDNN's threads are OpenMP's too.
# Defines BLIS::blis. Its library also exports the CBLAS and Fortran BLAS
# names, as OpenBLAS's does: link it after OpenBLAS so that those names
# stay OpenBLAS's (runtime/matmul.cc calls BLIS by its own bli_ API).
set(_blis_flavours blis-openmp blis-pthread blis-serial)
find_path(BLIS_INCLUDE_DIR NAMES blis.h PATH_SUFFIXES ${_blis_flavours}
  PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE} NO_DEFAULT_PATH)
find_library(BLIS_LIBRARY NAMES blis PATH_SUFFIXES ${_blis_flavours}
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE} NO_DEFAULT_PATH)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS REQUIRED_VARS BLIS_LIBRARY BLIS_INCLUDE_DIR)
if(BLIS_FOUND AND NOT TARGET BLIS::blis)
  add_library(BLIS::blis UNKNOWN IMPORTED)
  set_target_properties(BLIS::blis PROPERTIES
    IMPORTED_LOCATION "${BLIS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${BLIS_INCLUDE_DIR}")
endif()
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_LIBRARY)
