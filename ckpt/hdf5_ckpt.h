// HDF5 behind the checkpoint interfaces (formats/hdf5_file.h has the file
// format). A checkpoint is one file with one dataset per tensor holding the
// whole tensor, whatever the layout it was saved with: a sliced checkpoint
// is not cut into per-rank files or groups; instead each dataset is chunked
// along its layout's shard boundaries (capped at 4 MiB per chunk), so that
// loading one rank's box reads only that rank's chunks (a hyperslab).
// Attributes: "tessera.layout" on each dataset (human-readable), and on the
// root group "tessera.strategy" (strategy JSON), "tessera.step",
// "tessera.created_by", "tessera.meta.<key>".
#ifndef TESSERA_CKPT_HDF5_CKPT_H_
#define TESSERA_CKPT_HDF5_CKPT_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"

namespace tessera {

// Opens an HDF5 file; without "tessera.strategy" every dataset is a whole
// tensor on a one-rank mesh, in name order.
Result<std::unique_ptr<CheckpointReader>> OpenHdf5Checkpoint(const std::string& path);

Result<std::unique_ptr<CheckpointWriter>> CreateHdf5Checkpoint(Env* env, const std::string& path,
                                                               const Strategy& strategy,
                                                               const CheckpointMeta& meta,
                                                               bool overwrite);

bool IsHdf5Checkpoint(const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_HDF5_CKPT_H_
