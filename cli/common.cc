#include "cli/common.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/verbs.h"
#include "core/byte_size.h"
#include "core/utf8.h"

namespace tessera::cli {

void AddSourceStrategyFlag(CLI::App* cmd, std::string* value, const std::string& flag) {
  cmd->add_option(flag, *value,
                  "the source's strategy: a MindSpore strategy file or stage directory (needed "
                  "for a MindSpore distributed directory), or a Tessera strategy to check against");
}

void AddIoFlags(CLI::App* cmd, IoFlags* f, bool output) {
  cmd->add_option("--threads,-j", f->threads, "worker threads (default: one per core)");
  cmd->add_option("--memory-budget", f->memory_budget,
                  "tensor bytes held in memory at once, e.g. 256MiB, 1GiB");
  cmd->add_flag("--quiet,-q", f->quiet, "no progress bar, no summary");
  if (output) {
    cmd->add_option("--compress", f->compress, "none, zstd or zstd:LEVEL (1-19), native only");
    cmd->add_option(
        "--redundancy", f->redundancy,
        "native only: rs:K+M (Reed-Solomon, ISA-L: any M of each K data files and "
        "their M parity files rebuilt by verify --repair and on read) or parity:G (XOR)");
    cmd->add_flag("--overwrite", f->overwrite, "replace an existing output checkpoint");
    cmd->add_option("--format", f->format,
                    "output format: native, safetensors, mindspore (.ckpt), "
                    "mindspore-safetensors (MindSpore 2.3+'s format=\"safetensors\"), hdf5, "
                    "torch (torch.save of a flat state dict), dcp (PyTorch DCP directory, the "
                    "destination's pieces as chunks)")
        ->check(CLI::IsMember({"native", "safetensors", "mindspore", "mindspore-safetensors",
                               "hdf5", "torch", "dcp"}));
    cmd->add_option("--max-shard-size", f->max_shard_size,
                    "safetensors: shards of at most this size (e.g. 2GB) plus "
                    "model.safetensors.index.json; torch: pytorch_model-*.bin shards plus "
                    "pytorch_model.bin.index.json; mindspore-safetensors merged: "
                    "part<i>.safetensors of at most this size (default 3GiB)");
    cmd->add_option("--prefix", f->prefix,
                    "mindspore: rank files are rank_<r>/<prefix><r>.ckpt (or .safetensors)");
    cmd->add_option("--save-mindspore-strategy", f->save_mindspore_strategy,
                    "also write the output's strategy as a MindSpore strategy file");
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

namespace {

// Hugging Face's sizes: "5GB" is 5 * 10^9 bytes, "5GiB" 5 * 2^30.
Result<int64_t> ParseShardSize(const std::string& text) {
  std::string t = text;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, int64_t> kDecimal[] = {
      {"kb", 1000}, {"mb", 1000 * 1000}, {"gb", 1000 * 1000 * 1000}};
  for (const auto& [unit, scale] : kDecimal) {
    if (t.size() > 2 && t.compare(t.size() - 2, 2, unit) == 0 && t[t.size() - 3] != 'i') {
      try {
        size_t used = 0;
        const double v = std::stod(t.substr(0, t.size() - 2), &used);
        if (used == t.size() - 2 && v >= 0) return static_cast<int64_t>(v * scale);
      } catch (...) {
      }
      return InvalidArgumentError("size '" + text + "' is not a number with a unit");
    }
  }
  return ParseByteSize(text);
}

}  // namespace

Result<std::unique_ptr<CheckpointReader>> OpenSource(const std::string& path,
                                                     const std::string& src_strategy,
                                                     const std::string& flag) {
  return tessera::OpenSource(Env::Default(), path, src_strategy, flag);
}

Result<Strategy> DestinationStrategy(const CheckpointReader& src, const std::string& file,
                                     const std::string& mesh, std::set<std::string>* unnamed) {
  return tessera::DestinationStrategy(Env::Default(), src, file, mesh, unnamed);
}

int PrintDifferingCopies(const CheckpointReader& reader, const std::string& what) {
  auto lines = reader.DifferingCopies();
  if (!lines.ok()) return Report(lines.status());
  for (const std::string& line : *lines) {
    std::printf("note: %s: %s (read from the lowest stage)\n", PrintableText(what).c_str(),
                PrintableText(line).c_str());
  }
  return 0;
}

int RunWrite(const CheckpointReader& src, const Strategy& dst, const std::string& out,
             const IoFlags& flags, const std::string& verb, const std::set<std::string>& unnamed) {
  WriteOptions o;
  o.mindspore.order.unnamed = unnamed;
  Status s = ParseCompression(flags.compress, &o.native).Annotate("--compress");
  if (!s.ok()) return Report(s);
  s = ParseRedundancy(flags.redundancy, &o.native).Annotate("--redundancy");
  if (!s.ok()) return Report(s);
  o.native.overwrite = flags.overwrite;
  auto format = ParseFormat(flags.format);
  if (!format.ok()) return Report(format.status());
  o.format = *format;
  if (!flags.max_shard_size.empty()) {
    auto shard = ParseShardSize(flags.max_shard_size);
    if (!shard.ok()) return Report(shard.status().Annotate("--max-shard-size"));
    if (*shard <= 0) return Report(InvalidArgumentError("--max-shard-size must be positive"));
    o.max_shard_size = *shard;
  }
  o.mindspore.prefix = flags.prefix;
  if (!flags.save_mindspore_strategy.empty()) {
    // Checked before any data moves: MindSpore must be able to express it.
    auto complete = CompleteStrategy(src.strategy(), dst);
    if (!complete.ok()) return Report(complete.status());
    auto ms = StrategyToMindSpore(*complete);
    if (!ms.ok()) return Report(ms.status().Annotate("--save-mindspore-strategy"));
    Status w = WriteMindSporeStrategy(Env::Default(), flags.save_mindspore_strategy, *ms);
    if (!w.ok()) return Report(w);
  }
  auto budget = ParseByteSize(flags.memory_budget);
  if (!budget.ok()) return Report(budget.status());
  o.transform.memory_budget = *budget;
  o.transform.threads = flags.threads;
  o.transform.progress = MakeProgress(verb, flags.quiet);
  auto stats = WriteTransformed(Env::Default(), src, dst, out, o);
  if (!stats.ok()) return Report(stats.status());
  if (!flags.quiet) {
    std::printf(
        "%s: wrote %s: %lld tensors, %lld pieces, %s in %.2f s (%s/s)\n", verb.c_str(), out.c_str(),
        static_cast<long long>(stats->tensors), static_cast<long long>(stats->pieces),
        HumanBytes(stats->bytes).c_str(), stats->seconds,
        HumanBytes(static_cast<int64_t>(stats->bytes / std::max(stats->seconds, 1e-9))).c_str());
  }
  return 0;
}

}  // namespace tessera::cli
