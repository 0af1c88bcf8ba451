// ckpt verify: recompute every checksum; list what is missing or corrupt.
#include "ckpt/verify.h"

#include <iostream>

#include "ckpt/deepspeed_ckpt.h"
#include "ckpt/repair.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "core/byte_size.h"
#include "core/utf8.h"
#include "formats/native_files.h"

namespace tessera::cli {

CLI::App* AddVerifyVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string src, src_strategy;
    bool repair = false;
    IoFlags io;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("verify", "Check every piece of a checkpoint");
  cmd->add_option("src", a->src, "checkpoint")->required();
  AddSourceStrategyFlag(cmd, &a->src_strategy);
  cmd->add_flag("--repair", a->repair,
                "rebuild missing or corrupt files of a native checkpoint from its redundant "
                "copies or parity (saved with --redundancy), then verify again");
  AddIoFlags(cmd, &a->io, false);
  cmd->callback([a, run] {
    *run = [a] {
      Env* env = Env::Default();
      const bool native =
          env->IsDirectory(a->src) && !IsDeepSpeedCheckpoint(env, a->src) &&
          (HasManifest(env, a->src) || env->FileExists(JoinPath(a->src, kLatestName)));
      if (!native && env->FileExists(a->src)) {
        // Other formats: the structure checks of opening them (header
        // bounds, coverage, MindSpore's CRC when written), then every byte
        // of every tensor read back.
        auto src = OpenSource(a->src, a->src_strategy);
        if (!src.ok()) return Report(src.status());
        auto bytes = ReadEverything(**src, a->io.threads);
        if (!bytes.ok()) return Report(bytes.status());
        if (int rc = PrintDifferingCopies(**src, a->src); rc != 0) return rc;
        if (a->repair) {
          std::cerr << "ckpt: --repair: " << a->src << " is " << (*src)->format()
                    << ", which has no redundancy to repair from; verifying only\n";
        }
        if (!a->io.quiet) {
          const std::string checksums = (*src)->Checksums();
          std::cout << a->src << ": " << (*src)->format() << ", "
                    << (*src)->strategy().tensors().size() << " tensors, " << HumanBytes(*bytes)
                    << " read, 0 problems; "
                    << (checksums.empty() ? "this format keeps no checksums: its structure and "
                                            "sizes were checked"
                                          : "checked against " + checksums)
                    << "\n";
        }
        return 0;
      }
      VerifyOptions o;
      o.threads = a->io.threads;
      o.progress = MakeProgress("verify", a->io.quiet);
      if (a->repair) {
        auto fixed = RepairNativeCheckpoint(env, a->src, o);
        if (!fixed.ok()) return Report(fixed.status());
        for (const std::string& line : fixed->rebuilt) {
          if (!a->io.quiet) std::cout << "rebuilt " << PrintableText(line) << "\n";
        }
        for (const std::string& line : fixed->failed) {
          std::cerr << "ckpt: cannot rebuild " << PrintableText(line) << "\n";
        }
        for (const std::string& line : fixed->other)
          std::cerr << "ckpt: " << PrintableText(line) << "\n";
        if (!fixed->ok()) return 1;
      }
      auto r = VerifyNativeCheckpoint(env, a->src, o);
      if (!r.ok()) return Report(r.status());
      for (const VerifyProblem& p : r->problems) {
        std::string line;
        if (!p.file.empty() && p.what.find(p.file) == std::string::npos) line += p.file + ": ";
        if (!p.tensor.empty() && p.what.find(p.tensor) == std::string::npos) {
          line += "tensor '" + p.tensor + "': ";
        }
        std::cerr << "ckpt: " << PrintableText(line + p.what) << "\n";
      }
      for (const VerifyProblem& p : r->differing_copies) {
        std::cout << "note: " << PrintableText(p.file + ": tensor '" + p.tensor + "': " + p.what)
                  << " (read from the lowest stage)\n";
      }
      for (const std::string& risk : r->host_loss_risks) {
        std::cout << "note: " << PrintableText(risk) << ": losing that host loses data\n";
      }
      if (!a->io.quiet) {
        std::cout << r->path << ": " << r->files << " files, " << r->pieces << " pieces, "
                  << HumanBytes(r->bytes) << " verified, " << r->problems.size() << " problems\n";
      }
      return r->ok() ? 0 : 1;
    };
  });
  return cmd;
}

}  // namespace tessera::cli
