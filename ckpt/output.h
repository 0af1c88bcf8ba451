// Where a checkpoint writer builds its output and how it moves it into
// place: every format writes under `<path>.tmp-<pid>` (a directory or a
// single file) and renames it to `path` only when complete.
#ifndef TESSERA_CKPT_OUTPUT_H_
#define TESSERA_CKPT_OUTPUT_H_

#include <string>

#include "core/env.h"
#include "core/status.h"

namespace tessera {

struct OutputPaths {
  std::string path;  // final, without trailing '/'
  std::string tmp;   // `<path>.tmp-<pid>`
};

// Checks that `path` may be written (absent, or `overwrite`), removes
// temporaries left by writers that died, and names the temporary. With
// `directory` the temporary is created as an empty directory.
Result<OutputPaths> PrepareOutput(Env* env, const std::string& path, bool overwrite,
                                  bool directory);

// Renames the complete temporary to the final path (replacing what was
// there when `overwrite`) and makes the rename durable.
Status CommitOutput(Env* env, const OutputPaths& out, bool overwrite);

// Removes the temporary, file or directory.
void RemoveOutput(Env* env, const OutputPaths& out);

}  // namespace tessera

#endif  // TESSERA_CKPT_OUTPUT_H_
