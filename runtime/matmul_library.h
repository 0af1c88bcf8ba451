// The GEMM libraries the kernels' matrix products can come from
// (runtime/matmul.h) by the names machine profiles and --matmul-library
// use; header-only, so that the plan layer (a profile's parser) needs no
// kernels.
#ifndef TESSERA_RUNTIME_MATMUL_LIBRARY_H_
#define TESSERA_RUNTIME_MATMUL_LIBRARY_H_

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera {

enum class MatmulLibrary { kOpenBlas, kOneDnn, kBlis };
inline constexpr MatmulLibrary kMatmulLibraries[] = {MatmulLibrary::kOpenBlas,
                                                     MatmulLibrary::kOneDnn, MatmulLibrary::kBlis};

// "openblas", "onednn", "blis".
inline std::string_view MatmulLibraryName(MatmulLibrary library) {
  switch (library) {
    case MatmulLibrary::kOneDnn:
      return "onednn";
    case MatmulLibrary::kBlis:
      return "blis";
    default:
      return "openblas";
  }
}

// Every library's name, in kMatmulLibraries' order.
inline std::vector<std::string> MatmulLibraryNames() {
  std::vector<std::string> names;
  for (MatmulLibrary library : kMatmulLibraries) names.emplace_back(MatmulLibraryName(library));
  return names;
}

inline Result<MatmulLibrary> ParseMatmulLibrary(std::string_view name) {
  for (MatmulLibrary library : kMatmulLibraries) {
    if (MatmulLibraryName(library) == name) return library;
  }
  return InvalidArgumentError("unknown matrix-product library \"" + std::string(name) +
                              "\" (openblas, onednn or blis)");
}

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MATMUL_LIBRARY_H_
