#include "ckpt/verify.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "ckpt/save_plan.h"
#include "ckpt/transform.h"
#include "core/buffer.h"
#include "core/thread_pool.h"
#include "formats/native_files.h"
#include "formats/parity.h"

namespace tessera {
namespace {

// Pieces of one tensor must be disjoint and cover it: overlaps are found
// after sorting by the first dimension, so only pieces whose first
// intervals overlap are compared.
void CheckTiling(const TensorEntry& t, std::vector<VerifyProblem>* problems) {
  std::vector<const PieceInfo*> sorted;
  for (const PieceInfo& p : t.pieces) sorted.push_back(&p);
  const int rank = t.layout.rank();
  std::sort(sorted.begin(), sorted.end(), [&](const PieceInfo* a, const PieceInfo* b) {
    return rank == 0 ? false : a->box[0].begin < b->box[0].begin;
  });
  int64_t covered = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    covered += NumElements(sorted[i]->box);
    for (size_t j = i + 1; j < sorted.size(); ++j) {
      if (rank > 0 && sorted[j]->box[0].begin >= sorted[i]->box[0].end) break;
      if (!IsEmpty(Intersect(sorted[i]->box, sorted[j]->box))) {
        problems->push_back({"", t.name,
                             "pieces " + ToString(sorted[i]->box) + " and " +
                                 ToString(sorted[j]->box) + " overlap"});
        return;
      }
    }
  }
  if (covered != NumElements(t.layout)) {
    problems->push_back({"", t.name,
                         "pieces cover " + std::to_string(covered) + " of " +
                             std::to_string(NumElements(t.layout)) +
                             " elements (a piece is missing)"});
  }
}

}  // namespace

Result<VerifyReport> VerifyNativeCheckpoint(Env* env, const std::string& path,
                                            const VerifyOptions& options) {
  ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpointDir(env, path));
  std::string note;
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(env, dir, &note));
  VerifyReport report;
  report.path = dir;
  report.files = static_cast<int64_t>(m.files.size());
  report.host_loss_risks = HostLossRisks(m);
  if (!note.empty()) {
    report.problems.push_back({JoinPath(dir, kManifestName), "", note});
  } else if (m.format_version >= 2) {  // manifest.pb is good: its copy must be too
    const std::string copy = JoinPath(dir, kManifestCopyName);
    if (!env->FileExists(copy)) {
      report.problems.push_back({copy, "", "the manifest's copy is missing"});
    } else {
      Result<std::string> bytes = ReadFileToString(env, copy);
      Status s = bytes.ok() ? ParseManifest(*bytes, copy, false).status() : bytes.status();
      if (s.ok() && *bytes != SerializeManifest(m))
        s = DataLossError("it differs from manifest.pb");
      if (!s.ok()) report.problems.push_back({copy, "", s.message()});
    }
  }
  for (const DifferingCopy& d : DifferingStageCopies(m)) {
    report.differing_copies.push_back({JoinPath(dir, m.files[d.copy->file].name), d.tensor->name,
                                       "stage " + std::to_string(d.copy->stage) + "'s copy of " +
                                           ToString(d.copy->box) + " differs from stage " +
                                           std::to_string(d.tensor->layout.stage) + "'s"});
  }

  // Files: present, the recorded size, a valid header; parity files their
  // whole-file checksum.
  std::vector<bool> parity(m.files.size(), false);
  for (const ParityGroup& g : m.parity_groups) parity[g.parity] = true;
  for (const ErasureGroup& g : m.erasure_groups) {
    for (uint32_t f : g.parity) parity[f] = true;
  }
  // Data files that open with a good header. None is kept open: a
  // checkpoint of 16,384 ranks has more files than a process may open.
  std::vector<bool> usable(m.files.size(), false);
  // Files whose every byte matches the recorded whole-file checksum: their
  // pieces are as written (and were checked when written).
  std::vector<bool> intact(m.files.size(), false);
  for (size_t f = 0; f < m.files.size(); ++f) {
    const std::string fp = JoinPath(dir, m.files[f].name);
    if (!env->FileExists(fp)) {
      report.problems.push_back(
          {fp, "", parity[f] ? "parity file is missing" : "data file is missing"});
      continue;
    }
    if (parity[f]) {
      auto size = env->GetFileSize(fp);
      if (!size.ok() || *size != m.files[f].size) {
        report.problems.push_back({fp, "",
                                   "parity file has " + (size.ok() ? std::to_string(*size) : "?") +
                                       " bytes, the manifest records " +
                                       std::to_string(m.files[f].size)});
        continue;
      }
      auto sum = FileChecksum(env, fp);  // read only when the size is right
      if (!sum.ok() || (m.files[f].checksum != 0 && *sum != m.files[f].checksum)) {
        report.problems.push_back({fp, "", "parity file checksum mismatch (corrupt)"});
      } else {
        report.bytes += static_cast<int64_t>(*size);
      }
      continue;
    }
    auto file = env->NewRandomAccessFile(fp);
    if (!file.ok()) {
      report.problems.push_back({fp, "", file.status().message()});
      continue;
    }
    auto size = (*file)->Size();
    if (size.ok() && *size != m.files[f].size) {
      report.problems.push_back({fp, "",
                                 "has " + std::to_string(*size) + " bytes, the manifest records " +
                                     std::to_string(m.files[f].size)});
    }
    Status header = CheckDataFileHeader(**file, fp);
    if (!header.ok()) {
      report.problems.push_back({fp, "", header.message()});
      continue;
    }
    if (m.files[f].checksum != 0 && size.ok() && *size == m.files[f].size) {
      // Format 2 records every byte's checksum, padding included.
      auto sum = FileChecksum(env, fp);
      if (sum.ok() && *sum == m.files[f].checksum) {
        intact[f] = true;
        report.bytes += static_cast<int64_t>(*size);
      } else {  // its pieces are checked one by one below, to name the damage
        report.problems.push_back(
            {fp, "", sum.ok() ? "whole-file checksum mismatch (corrupt)" : sum.status().message()});
      }
    }
    usable[f] = true;
  }

  // Pieces: every checksum, in parallel; a piece in an unusable file is
  // counted against its tensor once per file.
  struct Job {
    const TensorEntry* tensor;
    const PieceInfo* piece;
  };
  std::vector<Job> jobs;
  std::map<std::pair<std::string, uint32_t>, int64_t> unreadable;
  int64_t total = 0;
  for (const TensorEntry& t : m.tensors) {
    CheckTiling(t, &report.problems);
    for (const auto* list : {&t.pieces, &t.copies}) {
      for (const PieceInfo& p : *list) {
        if (!usable[p.file]) {
          ++unreadable[{t.name, p.file}];
          continue;
        }
        if (intact[p.file]) {
          ++report.pieces;
          continue;
        }
        jobs.push_back({&t, &p});
        total += static_cast<int64_t>(p.length);
      }
    }
  }
  for (const auto& [key, n] : unreadable) {
    report.problems.push_back({JoinPath(dir, m.files[key.second].name), key.first,
                               std::to_string(n) + " piece(s) in this unusable file"});
  }
  // In tasks of one file's pieces (at most 64 MiB of them), each opening
  // its file for itself: at most one file per thread is open.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return std::tie(a.piece->file, a.piece->offset) < std::tie(b.piece->file, b.piece->offset);
  });
  constexpr uint64_t kTaskBytes = uint64_t{64} << 20;
  std::vector<std::pair<size_t, size_t>> tasks;  // [begin, end) of jobs
  uint64_t task_bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (tasks.empty() || jobs[i].piece->file != jobs[i - 1].piece->file ||
        task_bytes >= kTaskBytes) {
      tasks.push_back({i, i});
      task_bytes = 0;
    }
    ++tasks.back().second;
    task_bytes += jobs[i].piece->length;
  }
  std::mutex mu;
  int64_t done = 0;
  ThreadPool pool(options.threads);
  Status s = pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
    const auto [begin, end] = tasks[t];
    const std::string fp = JoinPath(dir, m.files[jobs[begin].piece->file].name);
    auto file = env->NewRandomAccessFile(fp);
    if (!file.ok()) {  // it opened in the first pass: one problem for the file, not one a piece
      std::lock_guard<std::mutex> lock(mu);
      report.problems.push_back({fp, "", file.status().message()});
      for (size_t i = begin; i < end; ++i) done += static_cast<int64_t>(jobs[i].piece->length);
      if (options.progress) options.progress(done, total);
      return Status::Ok();
    }
    for (size_t i = begin; i < end; ++i) {
      const Job& j = jobs[i];
      Status ps = VerifyPiece(**file, fp, j.tensor->name, *j.piece, j.tensor->layout.dtype);
      std::lock_guard<std::mutex> lock(mu);
      ++report.pieces;
      if (ps.ok()) {
        report.bytes += static_cast<int64_t>(j.piece->length);
      } else {
        report.problems.push_back({fp, j.tensor->name, ps.message()});
      }
      done += static_cast<int64_t>(j.piece->length);
      if (options.progress) options.progress(done, total);
    }
    return Status::Ok();
  });
  RETURN_IF_ERROR(s);
  std::sort(report.problems.begin(), report.problems.end(),
            [](const VerifyProblem& a, const VerifyProblem& b) {
              return std::tie(a.file, a.tensor, a.what) < std::tie(b.file, b.tensor, b.what);
            });
  return report;
}

Result<int64_t> ReadEverything(const CheckpointReader& reader, int threads) {
  struct Item {
    size_t tensor;
    Box box;
  };
  std::vector<Item> items;
  int64_t total = 0;
  for (size_t i = 0; i < reader.strategy().tensors().size(); ++i) {
    const Layout& l = reader.strategy().tensors()[i].layout;
    for (const Box& b :
         SplitBox(Box::FromShape(l.split_shape()), DTypeSize(l.dtype), int64_t{64} << 20)) {
      items.push_back({i, b});
      total += NumElements(b) * DTypeSize(l.dtype);
    }
  }
  ThreadPool pool(threads);
  RETURN_IF_ERROR(pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t k) -> Status {
    const Item& it = items[k];
    const TensorStrategy& t = reader.strategy().tensors()[it.tensor];
    ASSIGN_OR_RETURN(auto buf, AllocateBytes(NumElements(it.box) * DTypeSize(t.layout.dtype),
                                             "tensor '" + t.name + "'"));
    const std::vector<int64_t> ext = it.box.extents();
    return reader.ReadRegion(it.tensor, it.box, buf.get(), ext, Box::FromShape(ext));
  }));
  return total;
}

}  // namespace tessera
