#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "core/byte_size.h"
#include "cli/verbs.h"

namespace tessera::cli {

void AddIoFlags(CLI::App* cmd, IoFlags* f, bool output) {
  cmd->add_option("--threads,-j", f->threads, "worker threads (default: one per core)");
  cmd->add_option("--memory-budget", f->memory_budget,
                  "tensor bytes held in memory at once, e.g. 256MiB, 1GiB");
  cmd->add_flag("--quiet,-q", f->quiet, "no progress bar, no summary");
  if (output) {
    cmd->add_option("--compress", f->compress, "none, zstd or zstd:LEVEL (1-19)");
    cmd->add_flag("--overwrite", f->overwrite, "replace an existing output checkpoint");
  }
}

std::function<void(int64_t, int64_t)> MakeProgress(const std::string& label, bool quiet) {
  if (quiet || !::isatty(STDERR_FILENO)) return {};
  auto start = std::chrono::steady_clock::now();
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [label, start, last](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last < std::chrono::milliseconds(100)) return;
    *last = now;
    const double frac = total > 0 ? static_cast<double>(done) / total : 1.0;
    const double secs = std::chrono::duration<double>(now - start).count();
    const int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %s/%s %s/s ", label.c_str(),
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 static_cast<int>(frac * 100), HumanBytes(done).c_str(), HumanBytes(total).c_str(),
                 HumanBytes(secs > 0 ? static_cast<int64_t>(done / secs) : 0).c_str());
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

Result<std::unique_ptr<CheckpointReader>> OpenSource(const std::string& path,
                                                     const std::string& src_strategy) {
  ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(Env::Default(), path));
  if (src_strategy.empty()) return reader;
  ASSIGN_OR_RETURN(Strategy given, LoadStrategyFile(Env::Default(), src_strategy));
  const Strategy& recorded = reader->strategy();
  for (const TensorStrategy& t : given.tensors()) {
    const TensorStrategy* r = recorded.Find(t.name);
    if (r == nullptr) {
      return NotFoundError("--src-strategy '" + src_strategy + "' names tensor '" + t.name +
                           "', which '" + path + "' does not have");
    }
    ASSIGN_OR_RETURN(bool same, Equivalent(recorded.MeshOf(*r), r->layout, given.MeshOf(t), t.layout));
    if (!same) {
      return InvalidArgumentError("tensor '" + t.name + "': '" + path + "' records " +
                                  ToString(r->layout) + ", --src-strategy says " +
                                  ToString(t.layout));
    }
  }
  return reader;
}

Result<Strategy> DestinationStrategy(const CheckpointReader& src, const std::string& file,
                                     const std::string& mesh) {
  if (!file.empty() && !mesh.empty()) {
    return InvalidArgumentError("give either --strategy or --mesh, not both");
  }
  if (!file.empty()) return LoadStrategyFile(Env::Default(), file);
  if (mesh.empty()) return InvalidArgumentError("give --strategy FILE or --mesh axis=size,...");
  ASSIGN_OR_RETURN(Mesh m, Mesh::Parse(mesh));
  return WithMesh(src.strategy(), m);
}

int RunWrite(const CheckpointReader& src, const Strategy& dst, const std::string& out,
             const IoFlags& flags, const std::string& verb) {
  WriteOptions o;
  Status s = ParseCompression(flags.compress, &o.native).Annotate("--compress");
  if (!s.ok()) return Report(s);
  o.native.overwrite = flags.overwrite;
  auto budget = ParseByteSize(flags.memory_budget);
  if (!budget.ok()) return Report(budget.status());
  o.transform.memory_budget = *budget;
  o.transform.threads = flags.threads;
  o.transform.progress = MakeProgress(verb, flags.quiet);
  auto stats = WriteTransformed(Env::Default(), src, dst, out, o);
  if (!stats.ok()) return Report(stats.status());
  if (!flags.quiet) {
    std::printf("%s: wrote %s: %lld tensors, %lld pieces, %s in %.2f s (%s/s)\n", verb.c_str(),
                out.c_str(), static_cast<long long>(stats->tensors),
                static_cast<long long>(stats->pieces), HumanBytes(stats->bytes).c_str(),
                stats->seconds,
                HumanBytes(static_cast<int64_t>(stats->bytes / std::max(stats->seconds, 1e-9)))
                    .c_str());
  }
  return 0;
}

}  // namespace tessera::cli
