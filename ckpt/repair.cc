#include "ckpt/repair.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/checksum.h"
#include "formats/erasure.h"
#include "formats/native_files.h"
#include "formats/parity.h"

namespace tessera {
namespace {

constexpr uint64_t kChunk = 4 << 20;

struct Record {
  const TensorEntry* tensor;
  const PieceInfo* piece;
};

class Repairer {
 public:
  Repairer(Env* env, std::string dir, Manifest m)
      : env_(env), dir_(std::move(dir)), m_(std::move(m)) {
    for (const ParityGroup& g : m_.parity_groups) {
      parity_of_[g.parity] = &g;
      for (uint32_t f : g.members) group_of_[f] = &g;
    }
    for (const ErasureGroup& g : m_.erasure_groups) {
      for (const auto* list : {&g.members, &g.parity}) {
        for (uint32_t f : *list) erasure_of_[f] = &g;
      }
      for (uint32_t f : g.parity) headerless_.insert(f);
    }
    for (const auto& [f, g] : parity_of_) headerless_.insert(f);
  }

  std::string Path(uint32_t f) const { return JoinPath(dir_, m_.files[f].name); }
  const std::string& Name(uint32_t f) const { return m_.files[f].name; }

  // Rebuilds file `f` (known bad, every file in `bad` is bad); returns how,
  // or an error saying why it cannot.
  Result<std::string> Rebuild(uint32_t f, const std::set<uint32_t>& bad) {
    if (auto it = parity_of_.find(f); it != parity_of_.end())
      return RebuildParity(*it->second, bad);
    if (auto it = erasure_of_.find(f); it != erasure_of_.end() && headerless_.count(f)) {
      return FromErasure(f, *it->second, bad);
    }
    Result<std::string> from_copies = FromCopies(f, bad);
    if (from_copies.ok()) return from_copies;
    if (auto it = erasure_of_.find(f); it != erasure_of_.end()) {
      Result<std::string> from_erasure = FromErasure(f, *it->second, bad);
      if (from_erasure.ok()) return from_erasure;
      return DataLossError(from_copies.status().message() + "; " + from_erasure.status().message());
    }
    Result<std::string> from_parity = FromParity(f, bad);
    if (from_parity.ok()) return from_parity;
    return DataLossError(from_copies.status().message() + "; " + from_parity.status().message());
  }

 private:
  // The stored bytes of `rec`, from any good file holding the same piece.
  Result<std::string> GoodCopy(const Record& rec, const std::set<uint32_t>& bad, uint32_t* from) {
    for (const auto* list : {&rec.tensor->pieces, &rec.tensor->copies}) {
      for (const PieceInfo& q : *list) {
        if (q.file == rec.piece->file || bad.count(q.file) || q.box != rec.piece->box ||
            q.checksum != rec.piece->checksum || q.length != rec.piece->length) {
          continue;
        }
        Result<const RandomAccessFile*> file = Source(q.file);
        if (!file.ok()) continue;
        std::string bytes(q.length, '\0');
        if (!(*file)->Read(q.offset, q.length, bytes.data()).ok()) continue;
        if (Xxh3(bytes.data(), bytes.size()) != q.checksum) continue;
        *from = q.file;
        return bytes;
      }
    }
    // The damaged file itself, when this piece of it is intact (the damage
    // is elsewhere: another piece, the header or padding).
    if (Result<const RandomAccessFile*> file = Source(rec.piece->file); file.ok()) {
      std::string bytes(rec.piece->length, '\0');
      if ((*file)->Read(rec.piece->offset, rec.piece->length, bytes.data()).ok() &&
          Xxh3(bytes.data(), bytes.size()) == rec.piece->checksum) {
        *from = rec.piece->file;
        return bytes;
      }
    }
    return NotFoundError("no good copy");
  }

  // Files copies are read from, each opened once: good files, and a bad file
  // for its own intact pieces (every piece read is checked against its
  // checksum, and a rebuilt file replacing a path leaves an open one as it was).
  Result<const RandomAccessFile*> Source(uint32_t f) {
    auto& slot = sources_[f];
    if (!slot) {
      ASSIGN_OR_RETURN(slot, env_->NewRandomAccessFile(Path(f)));
    }
    return slot.get();
  }

  std::vector<Record> RecordsIn(uint32_t f) const {
    std::vector<Record> out;
    for (const TensorEntry& t : m_.tensors) {
      for (const auto* list : {&t.pieces, &t.copies}) {
        for (const PieceInfo& p : *list) {
          if (p.file == f) out.push_back({&t, &p});
        }
      }
    }
    std::sort(out.begin(), out.end(),
              [](const Record& a, const Record& b) { return a.piece->offset < b.piece->offset; });
    return out;
  }

  // Writes `f` through `fill` (which appends its bytes in order) under a
  // temporary name, checks every piece in it and renames it into place.
  template <typename Fill>
  Status Replace(uint32_t f, Fill&& fill) {
    const std::string path = Path(f), tmp = path + ".repair";
    Status s = [&]() -> Status {
      ASSIGN_OR_RETURN(auto out, env_->NewWritableFile(tmp));
      RETURN_IF_ERROR(fill(*out));
      RETURN_IF_ERROR(out->Sync());
      RETURN_IF_ERROR(out->Close());
      ASSIGN_OR_RETURN(uint64_t size, env_->GetFileSize(tmp));
      if (size != m_.files[f].size) {
        return DataLossError("rebuilt " + std::to_string(size) + " bytes, the manifest records " +
                             std::to_string(m_.files[f].size));
      }
      if (m_.files[f].checksum != 0) {
        ASSIGN_OR_RETURN(uint64_t sum, FileChecksum(env_, tmp));
        if (sum != m_.files[f].checksum) {
          return DataLossError("the rebuilt file does not match its recorded checksum");
        }
      }
      if (!headerless_.count(f)) {
        ASSIGN_OR_RETURN(auto file, env_->NewRandomAccessFile(tmp));
        RETURN_IF_ERROR(CheckDataFileHeader(*file, tmp));
        for (const Record& r : RecordsIn(f)) {
          RETURN_IF_ERROR(
              VerifyPiece(*file, tmp, r.tensor->name, *r.piece, r.tensor->layout.dtype));
        }
      }
      RETURN_IF_ERROR(env_->RenameFile(tmp, path));
      return env_->SyncDir(dir_);
    }();
    if (!s.ok() && env_->FileExists(tmp)) (void)env_->DeleteFile(tmp);  // best effort; s says why
    return s;
  }

  // Replaces file `f` with every byte of `src` (a file rebuilt through a
  // group).
  Status ReplaceFrom(uint32_t f, const RandomAccessFile& src) {
    return Replace(f, [&](WritableFile& out) -> Status {
      std::vector<char> buf(kChunk);
      for (uint64_t at = 0; at < m_.files[f].size; at += kChunk) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, m_.files[f].size - at));
        RETURN_IF_ERROR(src.Read(at, n, buf.data()));
        RETURN_IF_ERROR(out.Append(buf.data(), n));
      }
      return Status::Ok();
    });
  }

  Result<std::string> FromCopies(uint32_t f, const std::set<uint32_t>& bad) {
    std::vector<Record> records = RecordsIn(f);
    std::vector<std::string> bytes;
    std::set<std::string> sources;
    bool own = false;  // some pieces were read from the damaged file itself
    for (const Record& r : records) {
      uint32_t from = 0;
      Result<std::string> b = GoodCopy(r, bad, &from);
      if (!b.ok()) {
        return NotFoundError("no good copy of tensor '" + r.tensor->name + "' piece " +
                             ToString(r.piece->box));
      }
      bytes.push_back(std::move(*b));
      if (from == f) {
        own = true;
      } else {
        sources.insert(Name(from));
      }
    }
    RETURN_IF_ERROR(Replace(f, [&](WritableFile& out) -> Status {
      std::string header = DataFileHeader();
      RETURN_IF_ERROR(out.Append(header.data(), header.size()));
      uint64_t at = header.size();
      const std::string zeros(kPieceAlignment, '\0');
      auto pad_to = [&](uint64_t to) -> Status {
        while (at < to) {
          const uint64_t n = std::min<uint64_t>(to - at, zeros.size());
          RETURN_IF_ERROR(out.Append(zeros.data(), n));
          at += n;
        }
        return Status::Ok();
      };
      for (size_t i = 0; i < records.size(); ++i) {
        RETURN_IF_ERROR(pad_to(records[i].piece->offset));
        RETURN_IF_ERROR(out.Append(bytes[i].data(), bytes[i].size()));
        at += bytes[i].size();
      }
      return pad_to(m_.files[f].size);
    }));
    std::string text = sources.empty() ? "from" : "from copies in";
    for (const std::string& s : sources) text += " " + s;
    if (own) text += std::string(sources.empty() ? "" : " and") + " its own intact pieces";
    return records.empty() ? std::string("(no pieces; header rewritten)") : text;
  }

  Result<std::string> FromParity(uint32_t f, const std::set<uint32_t>& bad) {
    const auto it = group_of_.find(f);
    if (it == group_of_.end()) return NotFoundError("it is in no parity group");
    const ParityGroup& g = *it->second;
    std::vector<std::string> lost;
    for (uint32_t x : g.members) {
      if (x != f && bad.count(x)) lost.push_back(Name(x));
    }
    if (bad.count(g.parity)) lost.push_back(Name(g.parity));
    if (!lost.empty()) {
      std::string text = "its parity group (" + Name(g.parity) + ") has lost";
      for (const std::string& l : lost) text += " " + l;
      return DataLossError(text + " too (parity rebuilds one file per group)");
    }
    std::vector<ParityMember> others;
    std::string text = "from " + Name(g.parity) + " with";
    for (uint32_t x : g.members) {
      if (x == f) continue;
      others.push_back({Path(x), m_.files[x].size});
      text += " " + Name(x);
    }
    ASSIGN_OR_RETURN(auto src,
                     OpenParityRebuild(env_, others, {Path(g.parity), m_.files[g.parity].size},
                                       m_.files[f].size));
    RETURN_IF_ERROR(ReplaceFrom(f, *src));
    return text;
  }

  // File `f` of erasure group `g` (a member or a parity file), from the
  // group's files that are not bad (any K of them).
  Result<std::string> FromErasure(uint32_t f, const ErasureGroup& g,
                                  const std::set<uint32_t>& bad) {
    ASSIGN_OR_RETURN(ErasureCode code, ErasureCodeOf(g));
    std::string text = "from its " + code.ToString() + " group:", unusable;
    for (const auto* list : {&g.members, &g.parity}) {
      for (uint32_t x : *list) {
        if (x != f) (bad.count(x) ? unusable : text) += " " + Name(x);
      }
    }
    auto src =
        OpenErasureGroupRebuild(env_, dir_, m_, g, f, [&](uint32_t x) { return !bad.count(x); });
    if (!src.ok()) {
      return DataLossError(src.status().message() +
                           (unusable.empty() ? "" : " (lost too:" + unusable + ")"));
    }
    RETURN_IF_ERROR(ReplaceFrom(f, **src));
    return text;
  }

  Result<std::string> RebuildParity(const ParityGroup& g, const std::set<uint32_t>& bad) {
    std::vector<ParityMember> members;
    std::string text = "from";
    for (uint32_t x : g.members) {
      if (bad.count(x)) {
        return DataLossError("its member " + Name(x) + " is lost too");
      }
      members.push_back({Path(x), m_.files[x].size});
      text += " " + Name(x);
    }
    RETURN_IF_ERROR(Replace(g.parity, [&](WritableFile& out) -> Status {
      return AppendParity(env_, members, out, Path(g.parity), nullptr).status();
    }));
    return text;
  }

  Env* env_;
  std::string dir_;
  Manifest m_;
  std::map<uint32_t, const ParityGroup*> parity_of_, group_of_;
  std::map<uint32_t, const ErasureGroup*> erasure_of_;  // members and parity files
  std::set<uint32_t> headerless_;                       // parity files of either kind
  std::map<uint32_t, std::unique_ptr<RandomAccessFile>> sources_;
};

}  // namespace

Result<RepairReport> RepairNativeCheckpoint(Env* env, const std::string& path,
                                            const VerifyOptions& options) {
  ASSIGN_OR_RETURN(VerifyReport verify, VerifyNativeCheckpoint(env, path, options));
  RepairReport report;
  report.path = verify.path;
  if (verify.ok()) return report;
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(env, verify.path));
  std::map<std::string, uint32_t> index;
  for (uint32_t f = 0; f < m.files.size(); ++f) index[JoinPath(verify.path, m.files[f].name)] = f;
  std::set<uint32_t> bad;
  const std::string manifest = JoinPath(verify.path, kManifestName);
  const std::string copy = JoinPath(verify.path, kManifestCopyName);
  for (const VerifyProblem& p : verify.problems) {
    const auto it = index.find(p.file);
    if (p.file == manifest || p.file == copy) {
      // The other one is good (ReadManifest read it): written again from it.
      const bool main = p.file == manifest;
      Status s = WriteFileAtomically(env, p.file, SerializeManifest(m));
      const std::string name = main ? kManifestName : kManifestCopyName;
      if (s.ok()) {
        report.rebuilt.push_back(name + ": from " + (main ? kManifestCopyName : kManifestName));
      } else {
        report.failed.push_back(name + ": " + s.message());
      }
    } else if (it != index.end()) {
      bad.insert(it->second);
    } else {
      report.other.push_back((p.tensor.empty() ? "" : "tensor '" + p.tensor + "': ") + p.what);
    }
  }
  Repairer repairer(env, verify.path, std::move(m));
  std::map<uint32_t, std::string> why;
  bool progress = true;
  while (progress && !bad.empty()) {
    progress = false;
    for (uint32_t f : std::set<uint32_t>(bad)) {
      Result<std::string> how = repairer.Rebuild(f, bad);
      if (how.ok()) {
        report.rebuilt.push_back(repairer.Name(f) + ": " + *how);
        bad.erase(f);
        why.erase(f);
        progress = true;
      } else {
        why[f] = how.status().message();
      }
    }
  }
  for (uint32_t f : bad) report.failed.push_back(repairer.Name(f) + ": " + why[f]);
  return report;
}

}  // namespace tessera
