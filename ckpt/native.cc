#include "ckpt/native.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <shared_mutex>

#include "ckpt/output.h"
#include "core/byte_size.h"
#include "core/thread_pool.h"
#include "formats/erasure.h"
#include "formats/native_files.h"
#include "formats/parity.h"

namespace tessera {
namespace {

// The pieces of one tensor indexed for the regions a reader asks for, so
// that it visits only the pieces that can meet a region instead of all of
// them: a tensor of a 4,096-rank checkpoint has thousands. Pieces that tile
// the tensor as a grid (a sliced checkpoint's: every piece one cell between
// consecutive cut points along each dimension) are found cell by cell,
// exactly; others by where they start along the dimension that tells them
// apart best (a superset of those that meet the region).
class PieceIndex {
 public:
  static PieceIndex Of(const std::vector<PieceInfo>& pieces) {
    PieceIndex x;
    if (pieces.size() < kIndexed) return x;  // a scan is cheaper
    const int rank = pieces[0].box.rank();
    std::vector<std::vector<int64_t>> cuts(rank);  // per dimension: distinct begins, ascending
    size_t cells = 1;
    for (int d = 0; d < rank; ++d) {
      std::vector<int64_t>& begins = cuts[d];
      for (const PieceInfo& p : pieces) begins.push_back(p.box[d].begin);
      std::sort(begins.begin(), begins.end());
      begins.erase(std::unique(begins.begin(), begins.end()), begins.end());
      if (begins.size() > cuts[x.dim_].size()) x.dim_ = d;
      cells = cells <= pieces.size() ? cells * begins.size() : cells;
    }
    if (cells == pieces.size() && x.MakeGrid(pieces, std::move(cuts))) return x;
    x.order_.resize(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) x.order_[i] = static_cast<uint32_t>(i);
    const int d = x.dim_;
    std::sort(x.order_.begin(), x.order_.end(), [&](uint32_t a, uint32_t b) {
      return pieces[a].box[d].begin < pieces[b].box[d].begin;
    });
    for (uint32_t i : x.order_) {
      x.begins_.push_back(pieces[i].box[d].begin);
      x.longest_ = std::max(x.longest_, pieces[i].box[d].end - pieces[i].box[d].begin);
    }
    x.indexed_ = true;
    return x;
  }

  // Calls fn on every piece that may meet `region` (a superset of those
  // that do; exactly those on a grid), until fn returns false.
  template <typename Fn>
  void ForEach(const std::vector<PieceInfo>& pieces, const Box& region, Fn&& fn) const {
    if (!grid_.empty() && region.rank() == static_cast<int>(cuts_.size())) {
      ForEachCell(pieces, region, fn);
      return;
    }
    if (!indexed_ || region.rank() <= dim_) {
      for (const PieceInfo& p : pieces) {
        if (!fn(p)) return;
      }
      return;
    }
    // A piece meets the region along dim_ only if it begins before the
    // region's end and after its begin less the longest piece.
    const int64_t from = region[dim_].begin - longest_ + 1;
    for (auto it = std::lower_bound(begins_.begin(), begins_.end(), from);
         it != begins_.end() && *it < region[dim_].end; ++it) {
      if (!fn(pieces[order_[it - begins_.begin()]])) return;
    }
  }

 private:
  static constexpr size_t kIndexed = 16;
  static constexpr uint32_t kNoPiece = UINT32_MAX;

  // Whether the pieces are the cells of `cuts` (each piece from one cut to
  // the next along every dimension, each cell one piece); if so, the grid.
  bool MakeGrid(const std::vector<PieceInfo>& pieces, std::vector<std::vector<int64_t>> cuts) {
    const int rank = static_cast<int>(cuts.size());
    std::vector<uint32_t> grid(pieces.size(), kNoPiece);
    for (size_t i = 0; i < pieces.size(); ++i) {
      size_t cell = 0;
      for (int d = 0; d < rank; ++d) {
        const std::vector<int64_t>& c = cuts[d];
        const size_t k = static_cast<size_t>(
            std::lower_bound(c.begin(), c.end(), pieces[i].box[d].begin) - c.begin());
        // Ends where the next cell begins (the last: anywhere past its begin).
        if (k + 1 < c.size() && pieces[i].box[d].end != c[k + 1]) return false;
        cell = cell * c.size() + k;
      }
      if (grid[cell] != kNoPiece) return false;
      grid[cell] = static_cast<uint32_t>(i);
    }
    // The last cell along each dimension: all its pieces end alike.
    for (int d = 0; d < rank; ++d) {
      int64_t end = -1;
      for (const PieceInfo& p : pieces) {
        if (p.box[d].begin != cuts[d].back()) continue;
        if (end >= 0 && p.box[d].end != end) return false;
        end = p.box[d].end;
      }
      cuts[d].push_back(end);  // cuts[d][k + 1]: where cell k ends
    }
    cuts_ = std::move(cuts);
    grid_ = std::move(grid);
    steps_.assign(rank, 0);
    for (int d = 0; d < rank; ++d) {
      const std::vector<int64_t>& c = cuts_[d];  // begins, then the last cell's end
      if (c.size() < 3) continue;                // one cell: searched
      const int64_t step = c[1] - c[0];
      bool even = step > 0;
      for (size_t k = 1; even && k + 2 < c.size(); ++k) even = c[k + 1] - c[k] == step;
      if (even) steps_[d] = step;
    }
    return true;
  }

  template <typename Fn>
  void ForEachCell(const std::vector<PieceInfo>& pieces, const Box& region, Fn& fn) const {
    const int rank = static_cast<int>(cuts_.size());  // at most kMaxRank, as every Box
    std::array<size_t, kMaxRank> lo{}, hi{}, at{};
    for (int d = 0; d < rank; ++d) {
      const std::vector<int64_t>& c = cuts_[d];  // cells' begins, then the last one's end
      if (region[d].begin >= region[d].end || region[d].end <= c.front() ||
          region[d].begin >= c.back()) {
        return;
      }
      // Cells k with c[k] < region end and c[k + 1] > region begin.
      const size_t cells = c.size() - 1;
      if (const int64_t step = steps_[d]; step > 0) {
        // Cell k begins at c[0] + k * step.
        lo[d] = static_cast<size_t>(std::max<int64_t>(region[d].begin - c[0], 0) / step);
        lo[d] = std::min(lo[d], cells - 1);
        hi[d] = static_cast<size_t>(
            CeilDiv(static_cast<uint64_t>(region[d].end - c[0]), static_cast<uint64_t>(step)));
        hi[d] = std::min(hi[d], cells);
      } else {
        lo[d] = static_cast<size_t>(std::upper_bound(c.begin(), c.end() - 1, region[d].begin) -
                                    c.begin());
        lo[d] = lo[d] > 0 ? lo[d] - 1 : 0;
        hi[d] = static_cast<size_t>(std::lower_bound(c.begin(), c.end() - 1, region[d].end) -
                                    c.begin());
      }
      at[d] = lo[d];
    }
    for (;;) {
      size_t cell = 0;
      for (int d = 0; d < rank; ++d) cell = cell * (cuts_[d].size() - 1) + at[d];
      if (!fn(pieces[grid_[cell]])) return;
      int d = rank - 1;
      for (; d >= 0; --d) {
        if (++at[d] < hi[d]) break;
        at[d] = lo[d];
      }
      if (d < 0) return;
    }
  }

  // Per dimension of a grid: the distance between its cells' begins when
  // all but the last cell are that long (even splits), else 0; lets
  // ForEachCell find a region's cells by division rather than searches
  // (a 16,384-rank reshard looks up 1.6 million regions).
  std::vector<int64_t> steps_;
  bool indexed_ = false;
  int dim_ = 0;
  int64_t longest_ = 0;
  std::vector<uint32_t> order_;             // piece indices by begin along dim_
  std::vector<int64_t> begins_;             // their begins, ascending
  std::vector<std::vector<int64_t>> cuts_;  // a grid's: per dimension, cells' begins and the end
  std::vector<uint32_t> grid_;              // a grid's: the piece of each cell, row-major
};

// A checkpoint of this many pieces is indexed (reader) and committed
// (writer: its pieces renumbered, checked and sorted per tensor) on a pool.
constexpr size_t kParallelPieces = size_t{64} << 10;
// Data files synced at once when a checkpoint is committed.
constexpr size_t kConcurrentSyncs = 32;
// Pieces smaller than this are gathered per data file (DataFileWriter::
// Stage) and written a buffer at a time, at most kStagingBuffers buffers
// at once: files beyond them write straight through until a Flush or
// Commit returns a buffer.
constexpr size_t kStageBytes = size_t{1} << 20;
constexpr size_t kStagingBuffers = 64;

// A data file whose small reads (packed pieces, kPackedPieceLimit) are
// served from a window read ahead once a thread's reads of the file run
// forward. A reshard reads each destination rank's pieces in tensor
// order, which is the order of the pieces in the source files, so a
// 4,096-rank checkpoint's half a million pieces of a few KiB cost as many
// preads without it: a quarter of that reshard's CPU, most of it the
// system call rather than the copy. The window starts after two reads in
// a row and doubles up to kReadAheadMax; a read that does not continue
// the thread's last one in the file is passed through and drops the
// window, so scattered reads are not amplified. Windows are per thread
// (kReadAheadSlots files each, least recently used replaced): threads
// reading one file keep their own. Bytes come out exactly as the file's
// own Read gives them (and the caller checks them as it checks a direct
// read); a window that cannot be read is given up for the exact read,
// whose error names the file.
class ReadAheadFile : public RandomAccessFile {
 public:
  ReadAheadFile(std::unique_ptr<RandomAccessFile> base, uint64_t size)
      : base_(std::move(base)), size_(size), id_(next_id_.fetch_add(1) + 1) {}

  Status Read(uint64_t offset, size_t size, void* dst) const override {
    if (size == 0 || size >= kPackedPieceLimit) return base_->Read(offset, size, dst);
    Window& w = WindowOf(id_);
    if (offset >= w.begin && offset + size <= w.end) {
      std::memcpy(dst, w.bytes.get() + (offset - w.begin), size);
      w.next = offset + size;
      return Status::Ok();
    }
    const bool forward = w.read && offset >= w.next && offset - w.next <= kReadAheadGap;
    w.ahead = forward ? std::min(kReadAheadMax, std::max(2 * w.ahead, kReadAheadMin)) : 0;
    w.read = true;
    w.next = offset + size;
    w.begin = w.end = 0;
    const uint64_t n = offset < size_ ? std::min<uint64_t>(size_ - offset, w.ahead) : 0;
    if (n <= size) return base_->Read(offset, size, dst);
    if (!w.bytes) w.bytes.reset(new char[kReadAheadMax]);
    if (!base_->Read(offset, n, w.bytes.get()).ok()) {
      w.ahead = 0;
      return base_->Read(offset, size, dst);
    }
    w.begin = offset;
    w.end = offset + n;
    std::memcpy(dst, w.bytes.get(), size);
    return Status::Ok();
  }

  Result<uint64_t> Size() const override { return base_->Size(); }
  Result<std::unique_ptr<FileView>> View(uint64_t offset, size_t size) const override {
    return base_->View(offset, size);
  }

 private:
  static constexpr uint64_t kReadAheadMin = 64 << 10;
  static constexpr uint64_t kReadAheadMax = 256 << 10;
  static constexpr uint64_t kReadAheadGap = 64 << 10;  // skipped bytes still "forward"
  static constexpr size_t kReadAheadSlots = 16;

  struct Window {
    uint64_t file = 0;  // id_ of the file it holds; 0: none
    uint64_t used = 0;  // for replacing the least recently used
    bool read = false;  // whether `next` is set
    uint64_t next = 0;  // where the thread's last read of the file ended
    uint64_t ahead = 0;
    uint64_t begin = 0, end = 0;  // bytes [begin, end) of the file are in `bytes`
    std::unique_ptr<char[]> bytes;
  };

  static Window& WindowOf(uint64_t id) {
    thread_local std::array<Window, kReadAheadSlots> windows;
    thread_local uint64_t clock = 0;
    Window* victim = &windows[0];
    for (Window& w : windows) {
      if (w.file == id) {
        w.used = ++clock;
        return w;
      }
      if (w.used < victim->used) victim = &w;
    }
    std::unique_ptr<char[]> bytes = std::move(victim->bytes);
    *victim = Window();
    victim->bytes = std::move(bytes);
    victim->file = id;
    victim->used = ++clock;
    return *victim;
  }

  std::unique_ptr<RandomAccessFile> base_;
  uint64_t size_;
  uint64_t id_;  // never reused, so no thread's window outlives its file's meaning
  static inline std::atomic<uint64_t> next_id_{0};
};

// The soft limit on open files (unlimited: half the largest size_t).
size_t DescriptorLimit() {
  struct rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::numeric_limits<size_t>::max() / 2;
  }
  return static_cast<size_t>(limit.rlim_cur);
}

size_t MaxOpenDataFiles() { return std::clamp<size_t>(DescriptorLimit() / 4, 16, 1024); }

// A writer keeps about a third of the descriptor limit's data files open
// (a reader of the same reshard takes a quarter, the commit's syncs at
// most an eighth): those it is handed back (Flush) beyond that are parked,
// to be reopened by their next write or by the commit's sync.
size_t MaxOpenWrittenFiles() { return std::max<size_t>(DescriptorLimit() / 3, 8); }
size_t ConcurrentSyncs() { return std::clamp<size_t>(DescriptorLimit() / 8, 1, kConcurrentSyncs); }

class NativeReader : public CheckpointReader {
 public:
  // `manifest_note`: how the manifest was read when manifest.pb was lost.
  NativeReader(Env* env, std::string dir, Manifest manifest, Strategy strategy,
               std::string manifest_note)
      : env_(env),
        dir_(std::move(dir)),
        manifest_(std::move(manifest)),
        strategy_(std::move(strategy)),
        files_(manifest_.files.size()),
        last_use_(manifest_.files.size()) {
    if (!manifest_note.empty()) recoveries_.push_back(std::move(manifest_note));
    meta_.step = manifest_.step;
    meta_.metadata = manifest_.metadata;
    meta_.created_by = manifest_.created_by;
    // Indexed on a pool when there are many pieces (a quarter of a
    // second for a 16,384-rank checkpoint's 1.7 million on one thread).
    index_.resize(manifest_.tensors.size());
    size_t pieces = 0;
    for (const TensorEntry& t : manifest_.tensors) pieces += t.pieces.size();
    (void)ForEachRange(index_.size(), pieces >= kParallelPieces, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) index_[i] = PieceIndex::Of(manifest_.tensors[i].pieces);
      return Status::Ok();
    });
  }

  const std::string& path() const override { return dir_; }
  std::string_view format() const override { return "native"; }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }

  TensorStorage Storage(size_t index) const override {
    TensorStorage s;
    for (const PieceInfo& p : manifest_.tensors[index].pieces) {
      ++s.pieces;
      s.stored_bytes += static_cast<int64_t>(p.length);
    }
    return s;
  }

  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    const TensorEntry& t = manifest_.tensors[index];
    RETURN_IF_ERROR(CheckReadRegion(strategy_.tensors()[index], "checkpoint", dir_, region));
    int64_t covered = 0;
    Status failed;
    index_[index].ForEach(t.pieces, region, [&](const PieceInfo& p) -> bool {
      const Box part = Intersect(p.box, region);
      if (IsEmpty(part)) return true;
      Box at = part;  // where `part` lands in dst
      for (int d = 0; d < part.rank(); ++d) {
        const int64_t shift = dst_box[d].begin - region[d].begin;
        at[d] = {part[d].begin + shift, part[d].end + shift};
      }
      auto read = [&](const PieceInfo& from, const RandomAccessFile& file) {
        return ReadPieceRegion(file, FilePath(from.file), t.name, from, t.layout.dtype, part, dst,
                               dst_extents, at);
      };
      if (CopyRemembered(t, p, part, dst, dst_extents, at)) {
        covered += NumElements(part);
        return true;
      }
      Result<std::shared_ptr<const RandomAccessFile>> file = File(p.file);
      Status s = file.ok() ? read(p, **file) : file.status();
      if (!s.ok()) s = Recover(t, p, s, read);
      if (!s.ok()) {
        failed = s;
        return false;
      }
      covered += NumElements(part);
      return true;
    });
    RETURN_IF_ERROR(failed);
    if (covered != NumElements(region)) {
      return DataLossError("checkpoint '" + dir_ + "': tensor '" + t.name + "': its pieces cover " +
                           std::to_string(covered) + " of the " +
                           std::to_string(NumElements(region)) + " elements of " +
                           ToString(region) + " (a piece is missing)");
    }
    return Status::Ok();
  }

  // The batch's pieces in file order, each read once: a small piece (one
  // checksum, read whole anyway) that several regions take parts of is
  // read and verified once and copied to each; the others are read part
  // by part as ReadRegion does. A region whose piece fails, or that the
  // pieces do not cover, is read again on its own by ReadRegion, which
  // reads around the damage (copies, parity) or names it.
  Status ReadRegions(const std::vector<RegionRead>& reads) const override {
    struct Part {
      const PieceInfo* piece;
      uint32_t read;
    };
    std::vector<Part> parts;
    parts.reserve(2 * reads.size());
    for (size_t r = 0; r < reads.size(); ++r) {
      const RegionRead& read = reads[r];
      const TensorEntry& t = manifest_.tensors[read.index];
      RETURN_IF_ERROR(
          CheckReadRegion(strategy_.tensors()[read.index], "checkpoint", dir_, read.region));
      index_[read.index].ForEach(t.pieces, read.region, [&](const PieceInfo& p) {
        if (!IsEmpty(Intersect(p.box, read.region))) {
          parts.push_back({&p, static_cast<uint32_t>(r)});
        }
        return true;
      });
    }
    std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
      if (a.piece->file != b.piece->file) return a.piece->file < b.piece->file;
      if (a.piece->offset != b.piece->offset) return a.piece->offset < b.piece->offset;
      if (a.piece != b.piece) return a.piece < b.piece;
      return a.read < b.read;
    });
    std::vector<int64_t> covered(reads.size(), 0);
    std::vector<char> failed(reads.size(), 0);
    std::vector<std::vector<int64_t>> extents(reads.size());
    for (size_t r = 0; r < reads.size(); ++r) extents[r] = reads[r].region.extents();
    std::shared_ptr<const RandomAccessFile> file;
    uint32_t file_index = UINT32_MAX;
    std::string path;
    thread_local std::vector<char> whole;  // a small piece several regions take parts of
    for (size_t g = 0; g < parts.size();) {
      size_t e = g + 1;
      while (e < parts.size() && parts[e].piece == parts[g].piece) ++e;
      const PieceInfo& p = *parts[g].piece;
      const TensorEntry& t = manifest_.tensors[reads[parts[g].read].index];
      const int64_t es = DTypeSize(t.layout.dtype);
      if (p.file != file_index) {
        file_index = p.file;
        path = FilePath(p.file);
        Result<std::shared_ptr<const RandomAccessFile>> opened = File(p.file);
        file = opened.ok() ? *opened : nullptr;
      }
      bool ok = file != nullptr;
      // Small and of one checksum: read whole anyway, so once for all its
      // parts (a larger piece's parts are read as ReadRegion reads them).
      const bool once = e - g > 1 && p.block_checksums.empty() && p.raw_length <= kRememberedMax;
      if (ok && once) {
        whole.resize(p.raw_length);
        ok = ReadPiece(*file, path, t.name, p, t.layout.dtype, whole.data()).ok();
      }
      for (size_t k = g; ok && k < e; ++k) {
        const RegionRead& read = reads[parts[k].read];
        const Box part = Intersect(p.box, read.region);
        const Box at = RelativeTo(part, read.region);
        if (once) {
          CopyBox(whole.data(), p.box.extents(), RelativeTo(part, p.box), read.dst,
                  extents[parts[k].read], at, es);
        } else if (!CopyRemembered(t, p, part, read.dst, extents[parts[k].read], at)) {
          ok = ReadPieceRegion(*file, path, t.name, p, t.layout.dtype, part, read.dst,
                               extents[parts[k].read], at)
                   .ok();
          if (!ok) break;
        }
        covered[parts[k].read] += NumElements(part);
      }
      if (!ok) {
        for (size_t k = g; k < e; ++k) failed[parts[k].read] = 1;
      }
      g = e;
    }
    for (size_t r = 0; r < reads.size(); ++r) {
      if (failed[r] || covered[r] != NumElements(reads[r].region)) {
        RETURN_IF_ERROR(ReadRegion(reads[r].index, reads[r].region, reads[r].dst, extents[r],
                                   Box::FromShape(extents[r])));
      }
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<FileView>> ViewRegion(size_t index, const Box& region) const override {
    const TensorEntry& t = manifest_.tensors[index];
    RETURN_IF_ERROR(CheckReadRegion(strategy_.tensors()[index], "checkpoint", dir_, region));
    std::unique_ptr<FileView> out;
    index_[index].ForEach(t.pieces, region, [&](const PieceInfo& p) -> bool {
      if (Intersect(p.box, region) != region) return true;
      // Small pieces are never lent (ViewPieceRegion): not worth opening
      // the file for.
      if (p.block_checksums.empty() && p.length < kViewAtLeast) return false;
      // A piece that cannot be read is left to ReadRegion, which reads
      // around it.
      Result<std::shared_ptr<const RandomAccessFile>> file = File(p.file);
      if (!file.ok()) return false;
      Result<std::unique_ptr<FileView>> view =
          ViewPieceRegion(**file, FilePath(p.file), t.name, p, t.layout.dtype, region);
      if (view.ok()) out = std::move(*view);
      return false;
    });
    return out;
  }

  Result<std::vector<std::string>> DifferingCopies() const override {
    std::vector<std::string> out;
    for (const DifferingCopy& d : DifferingStageCopies(manifest_)) {
      out.push_back("tensor '" + d.tensor->name + "': stage " + std::to_string(d.copy->stage) +
                    "'s copy of " + ToString(d.copy->box) + " in '" +
                    manifest_.files[d.copy->file].name + "' differs from stage " +
                    std::to_string(d.tensor->layout.stage) + "'s in '" +
                    manifest_.files[d.piece->file].name + "'");
    }
    return out;
  }

  std::vector<StoredFile> Files() const override {
    std::vector<StoredFile> out;
    for (const FileInfo& f : manifest_.files) out.push_back({f.name, f.size, f.host, "", false});
    auto mark = [&](uint32_t f, const std::string& group, bool parity) {
      if (f < out.size()) {
        out[f].group = group;
        out[f].parity = parity;
      }
    };
    for (size_t g = 0; g < manifest_.parity_groups.size(); ++g) {
      const std::string name = "parity group " + std::to_string(g);
      for (uint32_t f : manifest_.parity_groups[g].members) mark(f, name, false);
      mark(manifest_.parity_groups[g].parity, name, true);
    }
    for (size_t g = 0; g < manifest_.erasure_groups.size(); ++g) {
      const ErasureGroup& e = manifest_.erasure_groups[g];
      const std::string name = "rs:" + std::to_string(e.members.size()) + "+" +
                               std::to_string(e.parity.size()) + " group " + std::to_string(g);
      for (uint32_t f : e.members) mark(f, name, false);
      for (uint32_t f : e.parity) mark(f, name, true);
    }
    return out;
  }

  std::string Checksums() const override { return "the XXH3-64 of every piece"; }
  std::vector<std::string> Recoveries() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return recoveries_;
  }

 private:
  std::string FilePath(uint32_t i) const { return JoinPath(dir_, manifest_.files[i].name); }

  // The pieces this thread verified last, kept whole. A reshard's
  // neighbouring destination ranks take parts of the same small source
  // pieces (tp 8 -> 16: each half of every piece), and Transform works
  // them one after the other: the second part is copied from the bytes
  // checked for the first, neither read nor hashed again (every byte used
  // was still verified: these are the very bytes). Small pieces with one
  // checksum only: ReadPieceRegion reads those whole anyway. Keyed by the
  // reader's id, never reused, and the piece's record.
  static constexpr uint64_t kRememberedMax = 256 << 10;
  static constexpr size_t kRememberedSlots = 8;
  struct Remembered {
    uint64_t reader = 0;
    const PieceInfo* piece = nullptr;
    uint64_t used = 0;
    std::vector<char> raw;
  };
  static std::array<Remembered, kRememberedSlots>& RememberedPieces() {
    thread_local std::array<Remembered, kRememberedSlots> slots;
    return slots;
  }

  // Copies `part` of piece `p` into dst at `at` from this thread's
  // remembered pieces, reading and verifying it whole first when it is
  // small, not there and `part` is not all of it. False when `p` is not
  // such a piece or cannot be read: the caller reads it as usual (and
  // names what failed).
  bool CopyRemembered(const TensorEntry& t, const PieceInfo& p, const Box& part, void* dst,
                      const std::vector<int64_t>& dst_extents, const Box& at) const {
    if (p.raw_length > kRememberedMax || !p.block_checksums.empty()) return false;
    thread_local uint64_t clock = 0;
    std::array<Remembered, kRememberedSlots>& slots = RememberedPieces();
    Remembered* hit = nullptr;
    Remembered* victim = &slots[0];
    for (Remembered& r : slots) {
      if (r.reader == id_ && r.piece == &p) {
        hit = &r;
        break;
      }
      if (r.used < victim->used) victim = &r;
    }
    if (hit == nullptr) {
      // A read of the whole piece goes straight to dst, as before: only a
      // part is worth keeping the rest for.
      if (p.box == part) return false;
      Result<std::shared_ptr<const RandomAccessFile>> file = File(p.file);
      if (!file.ok()) return false;
      victim->reader = 0;
      victim->raw.resize(p.raw_length);
      if (!ReadPiece(**file, FilePath(p.file), t.name, p, t.layout.dtype, victim->raw.data())
               .ok()) {
        return false;
      }
      victim->reader = id_;
      victim->piece = &p;
      hit = victim;
    }
    hit->used = ++clock;
    CopyBox(hit->raw.data(), p.box.extents(), RelativeTo(part, p.box), dst, dst_extents, at,
            DTypeSize(t.layout.dtype));
    return true;
  }

  // Piece `p` of `t` could not be read (`lost`): reads it through `read`
  // from a copy in another file, else from its file rebuilt through its
  // parity group, and notes which; else returns `lost` with what was tried.
  template <typename Read>
  Status Recover(const TensorEntry& t, const PieceInfo& p, const Status& lost, Read&& read) const {
    std::string tried;
    for (const PieceInfo& c : t.copies) {
      // A copy stage's copy may differ from the piece: used only when equal.
      if (c.box != p.box || c.file == p.file || c.checksum != p.checksum || c.length != p.length) {
        continue;
      }
      Result<std::shared_ptr<const RandomAccessFile>> file = File(c.file);
      Status s = file.ok() ? read(c, **file) : file.status();
      if (s.ok()) {
        Note(p.file, "read from its copies in " + manifest_.files[c.file].name);
        return Status::Ok();
      }
      tried += "; its copy in " + manifest_.files[c.file].name + " failed too: " + s.message();
    }
    Result<const RandomAccessFile*> rebuilt = Rebuilt(p.file);
    if (rebuilt.ok() && *rebuilt != nullptr) {
      Status s = read(p, **rebuilt);
      if (s.ok()) {
        Note(p.file, "rebuilt from " + GroupText(p.file));
        return Status::Ok();
      }
      tried += "; rebuilding it from " + GroupText(p.file) + " failed too: " + s.message();
    } else if (!rebuilt.ok()) {
      tried += "; rebuilding it from " + GroupText(p.file) +
               " failed too: " + rebuilt.status().message();
    }
    return Status(lost.code(), lost.message() + tried);
  }

  void Note(uint32_t file, const std::string& how) const {
    const std::string line = manifest_.files[file].name + " (missing or corrupt): " + how;
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(recoveries_.begin(), recoveries_.end(), line) == recoveries_.end()) {
      recoveries_.push_back(line);
    }
  }

  const ParityGroup* GroupOf(uint32_t file) const {
    for (const ParityGroup& g : manifest_.parity_groups) {
      if (std::find(g.members.begin(), g.members.end(), file) != g.members.end()) return &g;
    }
    return nullptr;
  }

  std::string GroupText(uint32_t file) const {
    if (const ErasureGroup* e = ErasureGroupOf(file)) {
      std::string text = "its rs:" + std::to_string(e->members.size()) + "+" +
                         std::to_string(e->parity.size()) + " group";
      for (const auto* list : {&e->members, &e->parity}) {
        for (uint32_t m : *list) {
          if (m != file) text += " " + manifest_.files[m].name;
        }
      }
      return text;
    }
    const ParityGroup* g = GroupOf(file);
    std::string text = "parity " + manifest_.files[g->parity].name + " with";
    for (uint32_t m : g->members) {
      if (m != file) text += " " + manifest_.files[m].name;
    }
    return text;
  }

  // `file` rebuilt through its parity group (opened once); null when it is
  // in none.
  // The erasure group holding `file`, or null.
  const ErasureGroup* ErasureGroupOf(uint32_t file) const {
    for (const ErasureGroup& g : manifest_.erasure_groups) {
      if (std::find(g.members.begin(), g.members.end(), file) != g.members.end()) return &g;
    }
    return nullptr;
  }

  // Whether file `f` may be read to rebuild another: present, of its
  // recorded size and, where recorded, its whole-file checksum (checked
  // once). Caller holds mu_.
  bool Intact(uint32_t f) const {
    auto [it, fresh] = intact_.emplace(f, false);
    if (!fresh) return it->second;
    const std::string path = FilePath(f);
    auto size = env_->GetFileSize(path);
    bool ok = size.ok() && *size == manifest_.files[f].size;
    if (ok && manifest_.files[f].checksum != 0) {
      auto sum = FileChecksum(env_, path);
      ok = sum.ok() && *sum == manifest_.files[f].checksum;
    }
    return it->second = ok;
  }

  Result<const RandomAccessFile*> Rebuilt(uint32_t file) const {
    if (const ErasureGroup* e = ErasureGroupOf(file)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = rebuilt_[file];
      if (!slot) {
        ASSIGN_OR_RETURN(slot, OpenErasureGroupRebuild(env_, dir_, manifest_, *e, file,
                                                       [&](uint32_t f) { return Intact(f); }));
      }
      return slot.get();
    }
    const ParityGroup* g = GroupOf(file);
    if (g == nullptr) return static_cast<const RandomAccessFile*>(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = rebuilt_[file];
    if (!slot) {
      std::vector<ParityMember> others;
      for (uint32_t m : g->members) {
        if (m != file) others.push_back({FilePath(m), manifest_.files[m].size});
      }
      ASSIGN_OR_RETURN(
          slot,
          OpenParityRebuild(env_, others, {FilePath(g->parity), manifest_.files[g->parity].size},
                            manifest_.files[file].size));
    }
    return slot.get();
  }

  // Data file i, opened and checked on first use. At most max_open_ stay
  // open, about the least recently used closed first (a reader still holding
  // one keeps it open until it is done): keeping every file open, a reshard
  // of a 16,384-rank checkpoint runs out of descriptors (20,000 here), the
  // writer holding its 8,192 as well.
  // Opening and checking run outside the lock. Every read takes it shared
  // and stamps its file with the count of opens so far, so the file
  // closed first is the one not used for the most opens (an exclusive
  // lock and a list moved on every read would be a reshard's most
  // contended lock: half a million reads on 2 threads).
  Result<std::shared_ptr<const RandomAccessFile>> File(uint32_t i) const {
    {
      std::shared_lock<std::shared_mutex> lock(files_mu_);
      if (files_[i]) return Used(i);
    }
    const std::string path = FilePath(i);
    // Opened without asking first whether it exists (a system call each
    // of 16,384 files): asked only when it cannot be opened.
    Result<std::unique_ptr<RandomAccessFile>> opened = env_->NewRandomAccessFile(path);
    if (!opened.ok()) {
      if (!env_->FileExists(path)) {
        return NotFoundError("checkpoint '" + dir_ + "': data file '" + path + "' is missing");
      }
      return opened.status();
    }
    std::unique_ptr<RandomAccessFile> file = std::move(opened).value();
    RETURN_IF_ERROR(CheckDataFileHeader(*file, path));
    ASSIGN_OR_RETURN(uint64_t size, file->Size());
    if (size != manifest_.files[i].size) {
      return DataLossError("data file '" + path + "' has " + std::to_string(size) +
                           " bytes, the manifest records " +
                           std::to_string(manifest_.files[i].size) + " (truncated or replaced)");
    }
    std::unique_lock<std::shared_mutex> lock(files_mu_);
    if (files_[i]) return Used(i);  // another reader opened it meanwhile
    if (open_.size() >= max_open_) {
      size_t victim = 0;
      for (size_t k = 1; k < open_.size(); ++k) {
        if (last_use_[open_[k]].load(std::memory_order_relaxed) <
            last_use_[open_[victim]].load(std::memory_order_relaxed)) {
          victim = k;
        }
      }
      files_[open_[victim]].reset();
      open_[victim] = open_.back();
      open_.pop_back();
    }
    opens_.fetch_add(1, std::memory_order_relaxed);
    files_[i] = std::make_shared<ReadAheadFile>(std::move(file), size);
    open_.push_back(i);
    return Used(i);
  }

  // Open file i, stamped as used now. Caller holds files_mu_ (shared at
  // least).
  std::shared_ptr<const RandomAccessFile> Used(uint32_t i) const {
    const uint64_t now = opens_.load(std::memory_order_relaxed);
    if (last_use_[i].load(std::memory_order_relaxed) != now) {
      last_use_[i].store(now, std::memory_order_relaxed);
    }
    return files_[i];
  }

  Env* env_;
  std::string dir_;
  Manifest manifest_;
  const uint64_t id_ = next_id_.fetch_add(1) + 1;  // for RememberedPieces
  static inline std::atomic<uint64_t> next_id_{0};
  std::vector<PieceIndex> index_;  // by tensor
  Strategy strategy_;
  CheckpointMeta meta_;
  mutable std::mutex mu_;
  // A quarter of the process's descriptors, at most 1,024: the rest are
  // left to the writer of a reshard and to the caller.
  const size_t max_open_ = MaxOpenDataFiles();
  mutable std::vector<std::shared_ptr<const RandomAccessFile>> files_;
  mutable std::shared_mutex files_mu_;                   // of files_ and open_
  mutable std::vector<uint32_t> open_;                   // the open files
  mutable std::vector<std::atomic<uint64_t>> last_use_;  // opens_ when each file was last used
  mutable std::atomic<uint64_t> opens_{0};
  mutable std::map<uint32_t, std::unique_ptr<RandomAccessFile>> rebuilt_;
  mutable std::map<uint32_t, bool> intact_;  // files checked for rebuilding others
  mutable std::vector<std::string> recoveries_;
};

class NativeWriter : public CheckpointWriter {
 public:
  NativeWriter(Env* env, OutputPaths out, Strategy strategy, CheckpointMeta meta,
               NativeWriteOptions options)
      : env_(env),
        out_(std::move(out)),
        path_(out_.path),
        tmp_(out_.tmp),
        strategy_(std::move(strategy)),
        meta_(std::move(meta)),
        options_(options),
        by_rank_(RanksOf(strategy_)),
        pieces_(strategy_.tensors().size()),
        copies_(strategy_.tensors().size()) {}

  ~NativeWriter() override {
    if (!committed_) Abort();
  }

  Status WritePiece(size_t index, int64_t shard_rank, const Box& box, const void* data) override {
    return WritePieces({{index, shard_rank, box, data}});
  }

  Status WritePieces(const std::vector<PieceWrite>& batch) override {
    // Encoding and checksumming run outside any lock.
    std::vector<StoredPiece> stored(batch.size());
    // Where each piece goes: a tensor several stages hold goes to the rank
    // on its lowest stage, a copy to the same rank's peer on each copy
    // stage.
    struct Place {
      Slot* slot;
      uint32_t piece;  // in `batch`
      int32_t stage;
      bool copy;
    };
    std::vector<Place> places;
    places.reserve(batch.size());
    std::vector<Record> written;
    written.reserve(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      const PieceWrite& w = batch[k];
      ASSIGN_OR_RETURN(const TensorStrategy* tp,
                       CheckWritePiece(strategy_, "checkpoint", path_, w.index, w.box));
      const TensorStrategy& t = *tp;
      const size_t size = static_cast<size_t>(NumElements(w.box) * DTypeSize(t.layout.dtype));
      ASSIGN_OR_RETURN(stored[k], EncodeStoredPiece(w.data, size, w.box, t.layout.dtype,
                                                    options_.codec, options_.level));
      const uint32_t piece = static_cast<uint32_t>(k);
      if (t.layout.stage_axis.empty()) {
        places.push_back({SlotFor(w.shard_rank), piece, 0, false});
        continue;
      }
      const Mesh& mesh = strategy_.MeshOf(t);
      const int axis = mesh.FindAxis(t.layout.stage_axis);
      // The rank at stage s: shard_rank moved along the stage axis.
      const int64_t base = w.shard_rank - mesh.Coordinate(w.shard_rank, axis) * mesh.Stride(axis);
      places.push_back({SlotFor(base + t.layout.stage * mesh.Stride(axis)), piece, 0, false});
      for (int64_t s : t.layout.copy_stages) {
        places.push_back(
            {SlotFor(base + s * mesh.Stride(axis)), piece, static_cast<int32_t>(s), true});
      }
    }
    // By file, each file's pieces in the batch's order; one lock per file.
    std::stable_sort(places.begin(), places.end(),
                     [](const Place& a, const Place& b) { return a.slot < b.slot; });
    for (size_t g = 0; g < places.size();) {
      Slot* slot = places[g].slot;
      std::lock_guard<std::mutex> lock(slot->mu);
      // Created by the first writer to the file, under its lock only:
      // creating 2,048 files takes a second, which a writer-wide lock
      // would make every other file wait for.
      if (!slot->writer) {
        ASSIGN_OR_RETURN(slot->writer,
                         DataFileWriter::Create(env_, JoinPath(tmp_, slot->name), slot->index));
        ++open_files_;
      } else if (slot->writer->parked()) {
        ++open_files_;  // reopened by the Append below
      }
      for (; g < places.size() && places[g].slot == slot; ++g) {
        const Place& place = places[g];
        const StoredPiece& piece = stored[place.piece];
        if (piece.size < kStageBytes && !slot->writer->staging()) {
          std::optional<std::string> buffer = TakeBuffer();
          if (buffer) slot->writer->Stage(std::move(*buffer), kStageBytes);
        }
        ASSIGN_OR_RETURN(PieceInfo info, slot->writer->Append(piece));
        info.stage = place.stage;
        written.push_back(
            {static_cast<uint32_t>(batch[place.piece].index), place.copy, std::move(info)});
      }
    }
    // The records to their tensors, under one of kPieceLocks locks by
    // tensor (a writer-wide lock would be the reshard's most contended
    // one: 1.6 million pieces), a run of one tensor's under one lock.
    // Threads writing the same tensors' pieces of other ranks at once
    // would take the same locks in the same order: each batch starts at a
    // place of its own.
    const size_t n = written.size();
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return written[a].tensor < written[b].tensor; });
    size_t g = n == 0 ? 0 : static_cast<size_t>(batch[0].shard_rank * 7919 % n);
    while (g < n && g > 0 && written[order[g]].tensor == written[order[g - 1]].tensor) ++g;
    for (size_t done = 0; done < n;) {
      const uint32_t tensor = written[order[g % n]].tensor;
      std::lock_guard<std::mutex> lock(piece_mu_[tensor % kPieceLocks]);
      for (; done < n && written[order[g % n]].tensor == tensor; ++g, ++done) {
        Record& r = written[order[g % n]];
        (r.copy ? copies_ : pieces_)[tensor].push_back(std::move(r.info));
      }
    }
    return Status::Ok();
  }

  Status Flush(int64_t shard_rank) override {
    Slot* slot = FindSlot(shard_rank);
    if (slot == nullptr) return Status::Ok();
    std::lock_guard<std::mutex> lock(slot->mu);
    if (!slot->writer || slot->writer->parked()) return Status::Ok();
    if (slot->writer->staging()) {
      ASSIGN_OR_RETURN(std::string buffer, slot->writer->Unstage());
      std::lock_guard<std::mutex> pool(buffers_mu_);
      spare_.push_back(std::move(buffer));
      --staging_;
    }
    // Its sync at commit then finds the disk done with most of it: 2,048
    // files synced at the end waited a second for their 2 GB.
    slot->writer->StartWriteback();
    // A reshard to more ranks than the process may hold files open: the
    // files handed back beyond the limit are closed until needed.
    if (open_files_ > max_open_files_) {
      RETURN_IF_ERROR(slot->writer->Park());
      --open_files_;
    }
    return Status::Ok();
  }

  Status Commit() override {
    Manifest m;
    m.step = meta_.step;
    m.metadata = meta_.metadata;
    m.created_by = meta_.created_by;
    m.mesh = strategy_.mesh();
    // Files in rank order; pieces renumbered to match. Each file is synced
    // on a pool of its own: a sync waits for the disk, and 2,048 of them
    // one after another take seconds where together they take one flush.
    std::vector<Slot*> in_order;
    for (auto& [rank, slot] : slots_) {
      if (!slot->writer) {  // its creation failed, and so did the WritePiece that tried
        return FailedPreconditionError("checkpoint '" + path_ + "': data file '" + slot->name +
                                       "' was never created");
      }
      in_order.push_back(slot.get());
    }
    std::vector<uint64_t> sizes(in_order.size());
    {
      ThreadPool syncs(static_cast<int>(std::min<size_t>(in_order.size(), ConcurrentSyncs())));
      RETURN_IF_ERROR(syncs.ParallelFor(static_cast<int64_t>(in_order.size()), [&](int64_t i) {
        ASSIGN_OR_RETURN(sizes[i], in_order[i]->writer->Finish());
        return Status::Ok();
      }));
    }
    std::vector<uint32_t> renumber(slots_.size());
    uint32_t next = 0;
    for (size_t i = 0; i < in_order.size(); ++i) {
      m.files.push_back({in_order[i]->name, sizes[i], in_order[i]->writer->checksum()});
      renumber[in_order[i]->index] = next++;
    }
    // Each tensor's pieces renumbered, checked and sorted on a pool: 1.6
    // million pieces of a 16,384-rank reshard took a third of a second
    // on one thread.
    m.tensors.resize(strategy_.tensors().size());
    size_t n_pieces = 0;
    for (size_t i = 0; i < pieces_.size(); ++i) n_pieces += pieces_[i].size() + copies_[i].size();
    {
      auto tensor = [&](size_t i) -> Status {
        const TensorStrategy& ts = strategy_.tensors()[i];
        TensorEntry& t = m.tensors[i];
        t = TensorEntry{ts.name, ts.layout, ts.mesh, std::move(pieces_[i]), std::move(copies_[i])};
        int64_t covered = 0;
        for (PieceInfo& p : t.pieces) {
          p.file = renumber[p.file];
          covered += NumElements(p.box);
        }
        for (PieceInfo& p : t.copies) p.file = renumber[p.file];
        if (covered != NumElements(ts.layout)) {
          return InternalError("checkpoint '" + path_ + "': tensor '" + ts.name +
                               "': pieces cover " + std::to_string(covered) + " of " +
                               std::to_string(NumElements(ts.layout)) + " elements");
        }
        const auto by_origin = [](const PieceInfo& a, const PieceInfo& b) {
          if (OriginLess(a.box, b.box)) return true;
          return !OriginLess(b.box, a.box) && a.stage < b.stage;
        };
        std::sort(t.pieces.begin(), t.pieces.end(), by_origin);
        std::sort(t.copies.begin(), t.copies.end(), by_origin);
        return Status::Ok();
      };
      RETURN_IF_ERROR(ForEachRange(m.tensors.size(), n_pieces >= kParallelPieces,
                                   [&](size_t lo, size_t hi) -> Status {
                                     for (size_t i = lo; i < hi; ++i) RETURN_IF_ERROR(tensor(i));
                                     return Status::Ok();
                                   }));
    }
    RETURN_IF_ERROR(WriteRedundancy(&m));
    RETURN_IF_ERROR(CommitManifest(env_, tmp_, m));
    RETURN_IF_ERROR(CommitOutput(env_, out_, options_.overwrite));
    committed_ = true;
    return Status::Ok();
  }

  void Abort() override {
    for (auto& r : by_rank_) r.store(nullptr, std::memory_order_relaxed);
    slots_.clear();
    RemoveOutput(env_, out_);
  }

 private:
  // A piece written: its tensor, whether it is a copy stage's, its record.
  struct Record {
    uint32_t tensor;
    bool copy;
    PieceInfo info;
  };
  struct Slot {
    std::mutex mu;
    std::unique_ptr<DataFileWriter> writer;
    std::string name;
    uint32_t index = 0;
  };

  // The ranks pieces go to: those of the strategy's meshes.
  static size_t RanksOf(const Strategy& strategy) {
    int64_t n = strategy.mesh().world_size();
    for (const TensorStrategy& t : strategy.tensors()) {
      n = std::max(n, strategy.MeshOf(t).world_size());
    }
    return static_cast<size_t>(n);
  }

  // The parity files of options_.redundancy over the data files (all of
  // m's files so far), recorded in `m`.
  Status WriteRedundancy(Manifest* m) {
    const Redundancy& red = options_.redundancy;
    std::vector<int64_t> hosts(m->files.size());
    for (size_t f = 0; f < hosts.size(); ++f) hosts[f] = static_cast<int64_t>(f);  // unknown
    ASSIGN_OR_RETURN(std::vector<PlannedGroup> groups, PlanGroups(hosts, red));
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<ParityMember> members;
      std::vector<uint32_t> files;
      for (int64_t f : groups[g].members) {
        files.push_back(static_cast<uint32_t>(f));
        members.push_back({JoinPath(tmp_, m->files[f].name), m->files[f].size});
      }
      std::vector<int> rows(red.erasure.k > 0 ? red.erasure.m : 1);
      std::iota(rows.begin(), rows.end(), 0);
      Result<std::vector<FileInfo>> written =
          WriteGroupParity(env_, tmp_, red, static_cast<int64_t>(g), members, rows,
                           "parity-" + std::to_string(g) + ".tsr");
      if (!written.ok()) return written.status().Annotate("checkpoint '" + path_ + "'");
      std::vector<uint32_t> parity;
      for (FileInfo& f : *written) {
        parity.push_back(static_cast<uint32_t>(m->files.size()));
        m->files.push_back(std::move(f));
      }
      if (red.erasure.k == 0) {
        m->parity_groups.push_back({files, parity[0]});
      } else {
        m->erasure_groups.push_back({kRsCauchy, files, parity});
      }
    }
    return Status::Ok();
  }

  // A staging buffer, if fewer than kStagingBuffers are out.
  std::optional<std::string> TakeBuffer() {
    std::lock_guard<std::mutex> lock(buffers_mu_);
    if (staging_ >= kStagingBuffers) return std::nullopt;
    ++staging_;
    if (spare_.empty()) return std::string();
    std::string b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }

  // The slot of `rank`'s data file; its writer is created by its first
  // user. Found without a lock once made (a rank of the strategy's
  // meshes): every piece written looks its file up.
  Slot* SlotFor(int64_t rank) {
    if (Slot* found = FindSlot(rank)) return found;
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = slots_[rank];
    if (!slot) {
      char name[32];
      std::snprintf(name, sizeof(name), "data-%05lld.tsr", static_cast<long long>(rank));
      slot = std::make_unique<Slot>();
      slot->index = static_cast<uint32_t>(slots_.size() - 1);
      slot->name = name;
      if (rank >= 0 && static_cast<size_t>(rank) < by_rank_.size()) {
        by_rank_[rank].store(slot.get(), std::memory_order_release);
      }
    }
    return slot.get();
  }

  // The slot of `rank`'s data file, or null if it has none yet.
  Slot* FindSlot(int64_t rank) {
    if (rank >= 0 && static_cast<size_t>(rank) < by_rank_.size()) {
      return by_rank_[rank].load(std::memory_order_acquire);
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(rank);
    return it == slots_.end() ? nullptr : it->second.get();
  }

  Env* env_;
  OutputPaths out_;
  std::string path_, tmp_;
  Strategy strategy_;
  CheckpointMeta meta_;
  NativeWriteOptions options_;
  std::mutex mu_;
  std::map<int64_t, std::unique_ptr<Slot>> slots_;  // owns them; guarded by mu_
  std::vector<std::atomic<Slot*>> by_rank_;         // slots_'s, by rank: read without mu_
  static constexpr size_t kPieceLocks = 64;
  std::array<std::mutex, kPieceLocks> piece_mu_;  // of pieces_ and copies_, by tensor
  std::vector<std::vector<PieceInfo>> pieces_;
  std::vector<std::vector<PieceInfo>> copies_;  // of copy stages
  std::atomic<size_t> open_files_{0};           // data files open (not parked)
  const size_t max_open_files_ = MaxOpenWrittenFiles();
  std::mutex buffers_mu_;
  size_t staging_ = 0;              // staging buffers out
  std::vector<std::string> spare_;  // returned ones, capacity kept
  bool committed_ = false;
};

}  // namespace

Result<std::unique_ptr<CheckpointReader>> OpenNativeCheckpoint(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(env, path));
  std::string note;
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(env, dir, &note));
  Strategy strategy(m.mesh);
  for (const TensorEntry& t : m.tensors) {
    RETURN_IF_ERROR(strategy.Add({t.name, t.layout, t.mesh}).Annotate("checkpoint '" + dir + "'"));
  }
  return std::unique_ptr<CheckpointReader>(
      new NativeReader(env, dir, std::move(m), std::move(strategy), std::move(note)));
}

Result<std::unique_ptr<CheckpointWriter>> CreateNativeCheckpoint(
    Env* env, const std::string& path, Strategy strategy, CheckpointMeta meta,
    const NativeWriteOptions& options) {
  ASSIGN_OR_RETURN(OutputPaths out, PrepareOutput(env, path, options.overwrite, true));
  return std::unique_ptr<CheckpointWriter>(
      new NativeWriter(env, std::move(out), std::move(strategy), std::move(meta), options));
}

Status ParseRedundancy(const std::string& text, NativeWriteOptions* o) {
  ASSIGN_OR_RETURN(Redundancy r, Redundancy::Parse(text));
  if (r.replicas > 1) {
    return InvalidArgumentError("redundancy '" + text +
                                "': replicas:K is for training's sliced saves; a converted "
                                "checkpoint stores each piece once (use parity:G or rs:K+M)");
  }
  o->redundancy = r;
  return Status::Ok();
}

Status ParseCompression(const std::string& text, NativeWriteOptions* o) {
  if (text == "none" || text == "raw") {
    o->codec = Codec::kRaw;
    return Status::Ok();
  }
  if (text.rfind("zstd", 0) == 0) {
    o->codec = Codec::kZstd;
    o->level = 3;
    if (text.size() > 4) {
      if (text[4] != ':') return InvalidArgumentError("compression '" + text + "': use zstd:LEVEL");
      try {
        o->level = std::stoi(text.substr(5));
      } catch (...) {
        return InvalidArgumentError("compression '" + text + "': the level is not a number");
      }
      if (o->level < 1 || o->level > 19) {
        return InvalidArgumentError("compression '" + text + "': zstd levels run from 1 to 19");
      }
    }
    return Status::Ok();
  }
  return InvalidArgumentError("compression '" + text + "': use none, zstd or zstd:LEVEL");
}

}  // namespace tessera
