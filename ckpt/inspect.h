// Inspect: what a checkpoint holds, as a table for people or JSON for tools.
#ifndef TESSERA_CKPT_INSPECT_H_
#define TESSERA_CKPT_INSPECT_H_

#include <string>

#include "ckpt/checkpoint.h"

namespace tessera {

// Header lines (path, format, step, mesh, totals, files and hosts), then
// one row per tensor: name, dtype, shape, placement, bytes, pieces, stored
// bytes; with `files`, then one row per stored file: name, bytes, host,
// redundancy group, role.
std::string InspectText(const CheckpointReader& reader, bool files = false);
// The same facts, plus metadata keys, each tensor's full layout and every
// stored file.
std::string InspectJson(const CheckpointReader& reader);
// "split [-, tp] opt [dp] stage pp=1", or "replicated".
std::string PlacementString(const Layout& layout);

}  // namespace tessera

#endif  // TESSERA_CKPT_INSPECT_H_
