#include "ckpt/dense.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/buffer.h"

namespace tessera {
namespace {

constexpr uint64_t kMergeGap = 4096;                 // read across gaps up to this
constexpr uint64_t kReadWindow = uint64_t{4} << 20;  // bytes staged per merged read

// Calls fn(file, file offset, block byte, n) for the stored pieces of the
// block's bytes [pos, pos + len).
template <typename Fn>
Status ForEachSegment(const DenseBlock& b, uint64_t pos, uint64_t len, Fn fn) {
  if (b.segments.empty()) return fn(b.file, b.offset + pos, pos, len);
  uint64_t start = 0;
  for (const DenseSegment& seg : b.segments) {
    const uint64_t end = start + seg.size;
    if (len > 0 && pos < end && pos + len > start) {
      const uint64_t from = std::max(pos, start), to = std::min(pos + len, end);
      RETURN_IF_ERROR(fn(seg.file, seg.offset + (from - start), from, to - from));
    }
    start = end;
  }
  return Status::Ok();
}

class DenseReader : public CheckpointReader {
 public:
  DenseReader(Env* env, DenseCheckpoint c) : env_(env), c_(std::move(c)), files_(c_.files.size()) {}

  const std::string& path() const override { return c_.path; }
  std::string_view format() const override { return c_.format; }
  const Strategy& strategy() const override { return c_.strategy; }
  const CheckpointMeta& meta() const override { return c_.meta; }
  StoredOrder Order() const override { return c_.order; }
  std::string Checksums() const override { return c_.checksums; }

  TensorStorage Storage(size_t index) const override {
    TensorStorage s;
    const int64_t es = DTypeSize(c_.strategy.tensors()[index].layout.dtype);
    for (const DenseBlock& b : c_.blocks[index]) {
      ++s.pieces;
      s.stored_bytes += NumElements(b.box) * es;
    }
    return s;
  }

  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    const TensorStrategy& t = c_.strategy.tensors()[index];
    RETURN_IF_ERROR(CheckReadRegion(t, c_.format + " checkpoint", c_.path, region));
    const int64_t es = DTypeSize(t.layout.dtype);
    for (const DenseBlock& b : distinct_[index]) {
      const Box part = Intersect(b.box, region);
      if (IsEmpty(part)) continue;
      Box at = part;  // where `part` lands in dst
      for (int d = 0; d < part.rank(); ++d) {
        const int64_t shift = dst_box[d].begin - region[d].begin;
        at[d] = {part[d].begin + shift, part[d].end + shift};
      }
      const std::vector<ByteRun> runs =
          ByteRuns(b.box.extents(), RelativeTo(part, b.box), dst_extents, at, es);
      const std::string ctx = c_.format + " checkpoint '" + c_.path + "': tensor '" + t.name +
                              "' " + ToString(part) + " in '" + c_.files[b.file] + "'";
      char* out = static_cast<char*>(dst);
      if (b.segments.empty()) {
        ASSIGN_OR_RETURN(const RandomAccessFile* file, File(b.file));
        RETURN_IF_ERROR(ReadRuns(*file, b.offset, runs, out).Annotate(ctx));
        continue;
      }
      for (const ByteRun& r : runs) {
        RETURN_IF_ERROR(ForEachSegment(b, r.src, r.len,
                                       [&](uint32_t f, uint64_t at_file, uint64_t pos, uint64_t n) {
                                         ASSIGN_OR_RETURN(const RandomAccessFile* file, File(f));
                                         return file->Read(at_file, n, out + r.dst + (pos - r.src));
                                       })
                            .Annotate(ctx));
      }
    }
    return Status::Ok();
  }

  // A region inside one stored block that is one contiguous run of one
  // file, lent from its mapping (these formats keep no checksums to check).
  Result<std::unique_ptr<FileView>> ViewRegion(size_t index, const Box& region) const override {
    const TensorStrategy& t = c_.strategy.tensors()[index];
    RETURN_IF_ERROR(CheckReadRegion(t, c_.format + " checkpoint", c_.path, region));
    for (const DenseBlock& b : distinct_[index]) {
      if (!Contains(b.box, region)) continue;
      if (!b.segments.empty()) break;
      const std::vector<int64_t> ext = region.extents();
      const std::vector<ByteRun> runs = ByteRuns(b.box.extents(), RelativeTo(region, b.box), ext,
                                                 Box::FromShape(ext), DTypeSize(t.layout.dtype));
      if (runs.size() != 1 || runs[0].len < kViewAtLeast) break;
      ASSIGN_OR_RETURN(const RandomAccessFile* file, File(b.file));
      return file->View(b.offset + runs[0].src, runs[0].len);
    }
    return std::unique_ptr<FileView>();
  }

  // Per tensor, one block of each distinct box.
  Status Index() {
    distinct_.resize(c_.blocks.size());
    for (size_t i = 0; i < c_.blocks.size(); ++i) {
      const TensorStrategy& t = c_.strategy.tensors()[i];
      const std::string ctx = c_.format + " checkpoint '" + c_.path + "': tensor '" + t.name + "'";
      const Box whole = Box::FromShape(t.layout.shape);
      int64_t covered = 0;
      for (const DenseBlock& b : c_.blocks[i]) {
        bool files_ok = b.file < c_.files.size();
        for (const DenseSegment& seg : b.segments)
          files_ok = files_ok && seg.file < c_.files.size();
        if (!files_ok || !Contains(whole, b.box)) {
          return DataLossError(ctx + ": a stored slice " + ToString(b.box) +
                               " lies outside shape " + ShapeToString(t.layout.shape));
        }
        bool seen = false;
        for (const DenseBlock& d : distinct_[i]) {
          if (d.box == b.box) {
            seen = true;
            break;
          }
          if (!IsEmpty(Intersect(d.box, b.box))) {
            return DataLossError(ctx + ": stored slices " + ToString(d.box) + " and " +
                                 ToString(b.box) + " overlap");
          }
        }
        if (seen) continue;
        distinct_[i].push_back(b);
        covered += NumElements(b.box);
      }
      if (covered != NumElements(whole)) {
        return DataLossError(ctx + ": its stored slices cover " + std::to_string(covered) + " of " +
                             std::to_string(NumElements(whole)) + " elements (a slice is missing)");
      }
    }
    return Status::Ok();
  }

 private:
  // Reads runs (ascending source offsets) from the file at `base`; runs
  // separated by small gaps are fetched with one read through a window.
  static Status ReadRuns(const RandomAccessFile& file, uint64_t base,
                         const std::vector<ByteRun>& runs, char* out) {
    std::unique_ptr<char[]> window;
    size_t i = 0;
    while (i < runs.size()) {
      size_t j = i + 1;
      uint64_t end = runs[i].src + runs[i].len;
      while (j < runs.size() && runs[j].src >= end && runs[j].src - end <= kMergeGap &&
             runs[j].src + runs[j].len - runs[i].src <= kReadWindow) {
        end = runs[j].src + runs[j].len;
        ++j;
      }
      if (j == i + 1) {
        RETURN_IF_ERROR(file.Read(base + runs[i].src, runs[i].len, out + runs[i].dst));
      } else {
        if (!window) window.reset(new char[kReadWindow]);
        RETURN_IF_ERROR(file.Read(base + runs[i].src, end - runs[i].src, window.get()));
        for (size_t k = i; k < j; ++k) {
          std::memcpy(out + runs[k].dst, window.get() + (runs[k].src - runs[i].src), runs[k].len);
        }
      }
      i = j;
    }
    return Status::Ok();
  }

  Result<std::vector<std::string>> DifferingCopies() const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < c_.blocks.size(); ++i) {
      const TensorStrategy& t = c_.strategy.tensors()[i];
      if (t.layout.copy_stages.empty()) continue;
      const uint64_t bytes_per = static_cast<uint64_t>(DTypeSize(t.layout.dtype));
      std::map<std::vector<int64_t>, const DenseBlock*> first;  // by box origin
      for (const DenseBlock& b : c_.blocks[i]) {
        auto [it, inserted] = first.emplace(b.box.origin(), &b);
        if (inserted) continue;
        const uint64_t n = static_cast<uint64_t>(NumElements(b.box)) * bytes_per;
        ASSIGN_OR_RETURN(std::string x, BlockBytes(*it->second, n));
        ASSIGN_OR_RETURN(std::string y, BlockBytes(b, n));
        if (x != y) {
          out.push_back("tensor '" + t.name + "': " + ToString(b.box) + " in '" + c_.files[b.file] +
                        "' differs from '" + c_.files[it->second->file] + "'");
        }
      }
    }
    return out;
  }

  Result<const RandomAccessFile*> File(uint32_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!files_[i]) {
      ASSIGN_OR_RETURN(files_[i], env_->NewRandomAccessFile(c_.files[i]));
    }
    return files_[i].get();
  }

  // The `n` dense bytes of block `b`.
  Result<std::string> BlockBytes(const DenseBlock& b, uint64_t n) const {
    std::string out(n, '\0');
    RETURN_IF_ERROR(
        ForEachSegment(b, 0, n, [&](uint32_t f, uint64_t at, uint64_t pos, uint64_t len) {
          ASSIGN_OR_RETURN(const RandomAccessFile* file, File(f));
          return file->Read(at, len, out.data() + pos);
        }));
    return out;
  }

  Env* env_;
  DenseCheckpoint c_;
  std::vector<std::vector<DenseBlock>> distinct_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<RandomAccessFile>> files_;
};

class DenseWriter : public CheckpointWriter {
 public:
  DenseWriter(Env* env, OutputPaths out, Strategy strategy, DensePlan plan, bool overwrite)
      : env_(env),
        out_(std::move(out)),
        strategy_(std::move(strategy)),
        plan_(std::move(plan)),
        overwrite_(overwrite) {
    for (const auto& blocks : plan_.blocks) written_.emplace_back(blocks.size(), 0);
  }
  ~DenseWriter() override {
    if (!committed_) Abort();
  }

  Status Open() {
    for (const DenseFilePlan& f : plan_.files) {
      const std::string path = FilePath(f);
      ASSIGN_OR_RETURN(auto file, env_->NewWritableFile(path));
      for (const auto& [offset, bytes] : f.fixed) {
        RETURN_IF_ERROR(file->WriteAt(offset, bytes.data(), bytes.size()));
      }
      files_.push_back(std::move(file));
    }
    file_mu_ = std::vector<std::mutex>(files_.size());
    return Status::Ok();
  }

  Status WritePiece(size_t index, int64_t /*shard_rank*/, const Box& box,
                    const void* data) override {
    ASSIGN_OR_RETURN(const TensorStrategy* tp,
                     CheckWritePiece(strategy_, "output", out_.path, index, box));
    const TensorStrategy& t = *tp;
    const int64_t es = DTypeSize(t.layout.dtype);
    const char* src = static_cast<const char*>(data);
    const std::vector<DenseBlock>& blocks = plan_.blocks[index];
    for (size_t k = 0; k < blocks.size(); ++k) {
      const DenseBlock& b = blocks[k];
      const Box part = Intersect(b.box, box);
      if (IsEmpty(part)) continue;
      for (const ByteRun& r : ByteRuns(box.extents(), RelativeTo(part, box), b.box.extents(),
                                       RelativeTo(part, b.box), es)) {
        RETURN_IF_ERROR(ForEachSegment(b, r.dst, r.len,
                                       [&](uint32_t f, uint64_t at_file, uint64_t pos, uint64_t n) {
                                         std::lock_guard<std::mutex> lock(file_mu_[f]);
                                         return files_[f]->WriteAt(at_file,
                                                                   src + r.src + (pos - r.dst), n);
                                       })
                            .Annotate("output '" + out_.path + "': tensor '" + t.name + "'"));
      }
      std::lock_guard<std::mutex> lock(mu_);
      written_[index][k] += NumElements(part);
    }
    return Status::Ok();
  }

  Status Commit() override {
    for (size_t i = 0; i < plan_.blocks.size(); ++i) {
      for (size_t k = 0; k < plan_.blocks[i].size(); ++k) {
        const DenseBlock& b = plan_.blocks[i][k];
        if (written_[i][k] != NumElements(b.box)) {
          return InternalError("output '" + out_.path + "': tensor '" +
                               strategy_.tensors()[i].name +
                               "': " + std::to_string(written_[i][k]) + " of the " +
                               std::to_string(NumElements(b.box)) + " elements of slice " +
                               ToString(b.box) + " were written");
        }
      }
    }
    for (size_t f = 0; f < files_.size(); ++f) {
      if (plan_.finalize) {
        RETURN_IF_ERROR(plan_.finalize(f, FilePath(plan_.files[f]), *files_[f]));
      }
      RETURN_IF_ERROR(files_[f]->Sync());
      RETURN_IF_ERROR(files_[f]->Close());
      ASSIGN_OR_RETURN(uint64_t size, env_->GetFileSize(FilePath(plan_.files[f])));
      if (size != plan_.files[f].size) {
        return InternalError("output file '" + FilePath(plan_.files[f]) + "' has " +
                             std::to_string(size) + " bytes, planned " +
                             std::to_string(plan_.files[f].size));
      }
    }
    if (plan_.directory) {
      // Sub-directories first, then the root.
      std::vector<std::string> dirs;
      for (const DenseFilePlan& f : plan_.files) dirs.push_back(Dirname(FilePath(f)));
      std::sort(dirs.begin(), dirs.end());
      dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
      for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) RETURN_IF_ERROR(env_->SyncDir(*it));
    }
    RETURN_IF_ERROR(CommitOutput(env_, out_, overwrite_));
    committed_ = true;
    return Status::Ok();
  }

  void Abort() override {
    files_.clear();
    RemoveOutput(env_, out_);
  }

  std::string FilePath(const DenseFilePlan& f) const {
    return plan_.directory ? JoinPath(out_.tmp, f.name) : out_.tmp;
  }

 private:
  Env* env_;
  OutputPaths out_;
  Strategy strategy_;
  DensePlan plan_;
  bool overwrite_;
  std::vector<std::unique_ptr<WritableFile>> files_;
  std::vector<std::mutex> file_mu_;
  std::mutex mu_;
  std::vector<std::vector<int64_t>> written_;
  bool committed_ = false;
};

}  // namespace

Result<std::unique_ptr<CheckpointReader>> OpenDenseCheckpoint(Env* env, DenseCheckpoint ckpt) {
  auto reader = std::make_unique<DenseReader>(env, std::move(ckpt));
  RETURN_IF_ERROR(reader->Index());
  return std::unique_ptr<CheckpointReader>(std::move(reader));
}

Result<std::unique_ptr<CheckpointWriter>> CreateDenseCheckpoint(Env* env, const std::string& path,
                                                                Strategy strategy, DensePlan plan,
                                                                bool overwrite) {
  if (plan.blocks.size() != strategy.tensors().size()) {
    return InternalError("output '" + path + "': a plan for " + std::to_string(plan.blocks.size()) +
                         " tensors, the strategy has " + std::to_string(strategy.tensors().size()));
  }
  if (!plan.directory && plan.files.size() != 1) {
    return InternalError("output '" + path + "': a single-file output planned with " +
                         std::to_string(plan.files.size()) + " files");
  }
  ASSIGN_OR_RETURN(OutputPaths out, PrepareOutput(env, path, overwrite, plan.directory));
  if (plan.directory) {
    for (const DenseFilePlan& f : plan.files) {
      const std::string dir = Dirname(JoinPath(out.tmp, f.name));
      if (dir != out.tmp) RETURN_IF_ERROR(env->CreateDirs(dir));
    }
  }
  auto writer = std::make_unique<DenseWriter>(env, std::move(out), std::move(strategy),
                                              std::move(plan), overwrite);
  Status s = writer->Open();
  if (!s.ok()) {
    writer->Abort();
    return s;
  }
  return std::unique_ptr<CheckpointWriter>(std::move(writer));
}

}  // namespace tessera
