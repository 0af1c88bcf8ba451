#include "ckpt/torch_ckpt.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <utility>

#include "ckpt/dense.h"
#include "ckpt/safetensors_ckpt.h"
#include "ckpt/torch_reader.h"
#include "core/checksum.h"
#include "core/endian.h"
#include "core/shape.h"
#include "core/utf8.h"
#include "formats/codec.h"
#include "formats/dcp.h"
#include "formats/torch_save.h"
#include "formats/zip.h"

namespace tessera {
namespace {

// Copies the elements of `extents` from `src` (byte strides `src_strides`)
// to `dst` (byte strides `dst_strides`), `elem` bytes each; runs that are
// dense on both sides are one memcpy.
void StridedCopy(const char* src, const std::vector<int64_t>& src_strides, char* dst,
                 const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& extents,
                 int64_t elem) {
  const size_t rank = extents.size();
  if (rank == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t e : extents) {
    if (e == 0) return;
  }
  const int64_t inner = extents[rank - 1];
  const bool dense = src_strides[rank - 1] == elem && dst_strides[rank - 1] == elem;
  std::vector<int64_t> idx(rank - 1, 0);
  while (true) {
    const char* s = src;
    char* d = dst;
    for (size_t k = 0; k + 1 < rank; ++k) {
      s += idx[k] * src_strides[k];
      d += idx[k] * dst_strides[k];
    }
    if (dense) {
      std::memcpy(d, s, inner * elem);
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        std::memcpy(d + j * dst_strides[rank - 1], s + j * src_strides[rank - 1], elem);
      }
    }
    size_t k = rank - 1;
    while (k > 0 && ++idx[k - 1] == extents[k - 1]) idx[--k] = 0;
    if (k == 0) return;
  }
}

class TorchReader : public CheckpointReader {
 public:
  TorchReader(std::string path, std::string format,
              std::vector<std::unique_ptr<TorchSource>> sources)
      : path_(std::move(path)), format_(std::move(format)), sources_(std::move(sources)) {
    strategy_ = Strategy(*Mesh::Create({"r"}, {1}));
    for (auto& src : sources_) {
      src->verified.reset(new std::atomic<bool>[src->contents.storages.size()]());
    }
  }

  // Adds a tensor; its pieces must be disjoint boxes covering it.
  Status Add(TorchEntry entry) {
    const std::string where =
        format_ + " checkpoint '" + path_ + "': tensor '" + PrintableText(entry.name) + "'";
    if (entry.shape.size() > static_cast<size_t>(kMaxRank)) {
      return UnimplementedError(where + " has " + std::to_string(entry.shape.size()) +
                                " dimensions, more than the " + std::to_string(kMaxRank) +
                                " Tessera handles");
    }
    RETURN_IF_ERROR(CheckPieces(entry, where));
    RETURN_IF_ERROR(strategy_.Add({entry.name, Layout::Replicated(entry.shape, entry.dtype), {}})
                        .Annotate(format_ + " checkpoint '" + path_ + "'"));
    entries_.push_back(std::move(entry));
    return Status::Ok();
  }
  void AddValue(const std::string& key, const std::string& text) {
    meta_.metadata[key] = text;
    const std::string tail = key.substr(key.find('.') + 1);
    if (tail == "iteration" || tail == "global_steps" || tail == "step") {
      char* end = nullptr;
      long long step = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0') meta_.step = step;
    }
  }

  const std::string& path() const override { return path_; }
  std::string_view format() const override { return format_; }
  std::string Checksums() const override {
    size_t with = 0, all = 0;
    for (const auto& src : sources_) {
      for (const TorchStorage& st : src->contents.storages) {
        ++all;
        with += st.has_crc ? 1 : 0;
      }
    }
    if (with == 0) return {};
    std::string out = "the CRC-32 of every storage's zip record";
    if (with < all) {
      out += " (" + std::to_string(with) + " of " + std::to_string(all) +
             " storages; legacy-format files have none)";
    }
    return out;
  }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }
  TensorStorage Storage(size_t index) const override {
    const TorchEntry& e = entries_[index];
    return {static_cast<int64_t>(e.pieces.size()), ByteSize(strategy_.tensors()[index].layout)};
  }

  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override {
    RETURN_IF_ERROR(
        CheckReadRegion(strategy_.tensors()[index], format_ + " checkpoint", path_, region));
    const TorchEntry& e = entries_[index];
    const int64_t elem = DTypeSize(e.dtype);
    const size_t rank = e.shape.size();
    std::vector<int64_t> dst_strides(rank);
    for (int64_t d = rank, step = elem; d-- > 0; step *= dst_extents[d]) dst_strides[d] = step;
    if (!e.pieces.empty() && e.pieces[0].flat) {
      return ReadFlat(e, region, static_cast<char*>(dst), dst_strides, dst_extents, dst_box);
    }
    for (const TorchPiece& piece : e.pieces) {
      const Box part = Intersect(piece.box, region);
      if (rank > 0 && IsEmpty(part)) continue;
      char* out = static_cast<char*>(dst);
      for (size_t d = 0; d < rank; ++d) {
        out += (dst_box[d].begin + part[d].begin - region[d].begin) * dst_strides[d];
      }
      RETURN_IF_ERROR(ReadPiece(piece, RelativeTo(part, piece.box), out, dst_strides));
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<FileView>> ViewRegion(size_t index, const Box& region) const override {
    RETURN_IF_ERROR(
        CheckReadRegion(strategy_.tensors()[index], format_ + " checkpoint", path_, region));
    const TorchEntry& e = entries_[index];
    if (!e.pieces.empty() && e.pieces[0].flat) return ViewFlat(e, region);
    for (const TorchPiece& piece : e.pieces) {
      if (!Contains(piece.box, region)) continue;
      const TorchSource& src = *sources_[piece.source];
      const TorchTensor& t = src.contents.tensors[piece.tensor];
      const Box local = RelativeTo(region, piece.box);
      if (!t.Contiguous() || t.shape.empty()) break;
      // Dense when only the first dimension is cut.
      int64_t row = DTypeSize(t.dtype);
      for (size_t d = 1; d < t.shape.size(); ++d) {
        if (local[d].begin != 0 || local[d].end != t.shape[d]) return std::unique_ptr<FileView>();
        row *= t.shape[d];
      }
      const uint64_t bytes = static_cast<uint64_t>(local[0].size()) * row;
      if (bytes < kViewAtLeast) break;
      RETURN_IF_ERROR(Verify(src, t.storage));
      const TorchStorage& st = src.contents.storages[t.storage];
      return src.file->View(
          st.offset + t.storage_offset * DTypeSize(t.dtype) + local[0].begin * row, bytes);
    }
    return std::unique_ptr<FileView>();
  }

 private:
  static constexpr size_t kMaxPieces = 65536;

  // Flat pieces in order, each a run of a contiguous stored tensor of the
  // entry's dtype, covering the tensor without gaps or overlaps.
  Status CheckFlatPieces(TorchEntry& e, const std::string& where) const {
    std::sort(e.pieces.begin(), e.pieces.end(),
              [](const TorchPiece& a, const TorchPiece& b) { return a.flat_begin < b.flat_begin; });
    const Result<int64_t> numel_or = ShapeElements(e.shape, e.dtype);
    if (!numel_or.ok()) return numel_or.status().Annotate(where);
    const int64_t numel = *numel_or;
    int64_t next = 0;
    for (const TorchPiece& p : e.pieces) {
      const TorchTensor& t = sources_[p.source]->contents.tensors[p.tensor];
      const std::string stored =
          "'" + PrintableText(t.name) + "' of '" + sources_[p.source]->path + "'";
      if (!p.flat || p.count <= 0 || p.flat_begin != next) {
        return DataLossError(where + ": its parts do not cover it once (elements from " +
                             std::to_string(next) + ")");
      }
      if (t.dtype != e.dtype || !t.Contiguous()) {
        return DataLossError(where + ": its part in " + stored + " is not a contiguous " +
                             std::string(DTypeName(e.dtype)) + " tensor");
      }
      if (p.src_begin < 0 || p.src_begin > t.Numel() - p.count) {
        return DataLossError(where + ": its part of " + std::to_string(p.count) + " elements at " +
                             std::to_string(p.src_begin) + " runs past " + stored + " (" +
                             std::to_string(t.Numel()) + " elements)");
      }
      next += p.count;
    }
    if (next != numel) {
      return DataLossError(where + ": its parts hold " + std::to_string(next) + " of its " +
                           std::to_string(numel) + " elements");
    }
    return Status::Ok();
  }

  Status CheckPieces(TorchEntry& e, const std::string& where) const {
    if (e.pieces.size() > kMaxPieces) {
      return DataLossError(where + " is cut into more than " + std::to_string(kMaxPieces) +
                           " chunks");
    }
    if (!e.pieces.empty() && e.pieces[0].flat) return CheckFlatPieces(e, where);
    const Box whole = Box::FromShape(e.shape);
    int64_t covered = 0;
    for (size_t i = 0; i < e.pieces.size(); ++i) {
      const TorchPiece& p = e.pieces[i];
      const TorchTensor& t = sources_[p.source]->contents.tensors[p.tensor];
      if (!Contains(whole, p.box) || t.shape != p.box.extents() || t.dtype != e.dtype) {
        return DataLossError(where + ": a chunk " + ToString(p.box) + " stored as " +
                             std::string(DTypeName(t.dtype)) + ShapeToString(t.shape) +
                             " does not fit the tensor's " + std::string(DTypeName(e.dtype)) +
                             ShapeToString(e.shape));
      }
      for (size_t j = 0; j < i; ++j) {
        if (e.shape.size() > 0 && !IsEmpty(Intersect(p.box, e.pieces[j].box))) {
          return DataLossError(where + ": chunks " + ToString(p.box) + " and " +
                               ToString(e.pieces[j].box) + " overlap");
        }
      }
      covered += NumElements(p.box);
    }
    if (covered != NumElements(whole)) {
      return DataLossError(where + ": its chunks do not cover it");
    }
    return Status::Ok();
  }

  // The flat piece holding element `flat` (pieces are sorted and cover the
  // tensor).
  static std::vector<TorchPiece>::const_iterator PieceAt(const TorchEntry& e, int64_t flat) {
    return std::prev(
        std::upper_bound(e.pieces.begin(), e.pieces.end(), flat,
                         [](int64_t f, const TorchPiece& p) { return f < p.flat_begin; }));
  }

  // Elements [flat, flat + count) of a tensor of flat pieces into `out`.
  Status ReadRun(const TorchEntry& e, int64_t flat, int64_t count, char* out) const {
    const int64_t elem = DTypeSize(e.dtype);
    for (auto it = PieceAt(e, flat); count > 0; ++it) {
      const int64_t skip = flat - it->flat_begin;
      const int64_t n = std::min(count, it->count - skip);
      const TorchSource& src = *sources_[it->source];
      const TorchTensor& t = src.contents.tensors[it->tensor];
      RETURN_IF_ERROR(Verify(src, t.storage));
      const uint64_t at = src.contents.storages[t.storage].offset +
                          static_cast<uint64_t>(t.storage_offset + it->src_begin + skip) * elem;
      RETURN_IF_ERROR(src.file->Read(at, n * elem, out));
      out += n * elem;
      flat += n;
      count -= n;
    }
    return Status::Ok();
  }

  // A region of a tensor of flat pieces as runs of consecutive elements in
  // both the tensor and the destination: the trailing dimensions both hold
  // whole are one run.
  Status ReadFlat(const TorchEntry& e, const Box& region, char* dst,
                  const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dst_extents,
                  const Box& dst_box) const {
    const size_t rank = e.shape.size();
    if (rank == 0) return ReadRun(e, 0, 1, dst);
    if (IsEmpty(region)) return Status::Ok();
    size_t d = rank - 1;
    int64_t run = region[d].size();
    while (d > 0 && region[d].size() == e.shape[d] && dst_extents[d] == e.shape[d]) {
      run *= region[--d].size();
    }
    std::vector<int64_t> tensor_strides(rank);
    for (int64_t k = rank, step = 1; k-- > 0; step *= e.shape[k]) tensor_strides[k] = step;
    std::vector<int64_t> idx(d, 0);
    while (true) {
      int64_t flat = 0;
      char* out = dst;
      for (size_t k = 0; k < rank; ++k) {
        const int64_t i = k < d ? idx[k] : 0;
        flat += (region[k].begin + i) * tensor_strides[k];
        out += (dst_box[k].begin + i) * dst_strides[k];
      }
      RETURN_IF_ERROR(ReadRun(e, flat, run, out));
      size_t k = d;
      while (k > 0 && ++idx[k - 1] == region[k - 1].size()) idx[--k] = 0;
      if (k == 0) return Status::Ok();
    }
  }

  // A view when the region is one run of consecutive elements inside one
  // flat piece.
  Result<std::unique_ptr<FileView>> ViewFlat(const TorchEntry& e, const Box& region) const {
    const size_t rank = e.shape.size();
    size_t first = 0;  // the first dimension the region holds more than one of
    while (first < rank && region[first].size() == 1) ++first;
    int64_t flat = 0, count = 1;
    for (size_t k = 0; k < rank; ++k) {
      if (k > first && region[k].size() != e.shape[k]) return std::unique_ptr<FileView>();
      flat = flat * e.shape[k] + region[k].begin;
      count *= region[k].size();
    }
    const int64_t elem = DTypeSize(e.dtype);
    if (count * elem < static_cast<int64_t>(kViewAtLeast)) return std::unique_ptr<FileView>();
    const auto it = PieceAt(e, flat);
    if (flat + count > it->flat_begin + it->count) return std::unique_ptr<FileView>();
    const TorchSource& src = *sources_[it->source];
    const TorchTensor& t = src.contents.tensors[it->tensor];
    RETURN_IF_ERROR(Verify(src, t.storage));
    return src.file->View(
        src.contents.storages[t.storage].offset +
            static_cast<uint64_t>(t.storage_offset + it->src_begin + flat - it->flat_begin) * elem,
        count * elem);
  }

  // `local` of a piece's source tensor into `out` (byte strides `dst_strides`).
  Status ReadPiece(const TorchPiece& piece, const Box& local, char* out,
                   const std::vector<int64_t>& dst_strides) const {
    const TorchSource& src = *sources_[piece.source];
    const TorchTensor& t = src.contents.tensors[piece.tensor];
    RETURN_IF_ERROR(Verify(src, t.storage));
    const int64_t elem = DTypeSize(t.dtype);
    const size_t rank = t.shape.size();
    std::vector<int64_t> extents(rank), src_strides(rank);
    int64_t lo = t.storage_offset, hi = t.storage_offset;
    for (size_t d = 0; d < rank; ++d) {
      extents[d] = local[d].size();
      src_strides[d] = t.strides[d] * elem;
      lo += local[d].begin * t.strides[d];
      hi += (local[d].end - 1) * t.strides[d];
    }
    const TorchStorage& st = src.contents.storages[t.storage];
    const uint64_t span = static_cast<uint64_t>(hi - lo + 1) * elem;
    const uint64_t at = st.offset + static_cast<uint64_t>(lo) * elem;
    ASSIGN_OR_RETURN(auto view, span >= kViewAtLeast ? src.file->View(at, span)
                                                     : Result<std::unique_ptr<FileView>>(nullptr));
    std::unique_ptr<char[]> staged;
    const char* bytes = view ? view->data() : nullptr;
    if (!bytes) {
      staged.reset(new char[span]);
      RETURN_IF_ERROR(src.file->Read(at, span, staged.get()));
      bytes = staged.get();
    }
    StridedCopy(bytes, src_strides, out, dst_strides, extents, elem);
    return Status::Ok();
  }

  // The storage's zip record against its CRC-32, the first time.
  static Status Verify(const TorchSource& src, size_t storage) {
    const TorchStorage& st = src.contents.storages[storage];
    if (!st.has_crc || src.verified[storage].load(std::memory_order_acquire)) return Status::Ok();
    const uint64_t bytes = static_cast<uint64_t>(st.numel) * DTypeSize(st.dtype);
    ASSIGN_OR_RETURN(uint32_t crc, Crc32OfRange(*src.file, st.offset, bytes));
    if (crc != st.crc32) {
      return DataLossError("'" + src.path + "': record '" + PrintableText(st.record) +
                           "' (storage '" + PrintableText(st.key) + "') fails its CRC-32");
    }
    src.verified[storage].store(true, std::memory_order_release);
    return Status::Ok();
  }

  std::string path_;
  std::string format_;
  std::vector<std::unique_ptr<TorchSource>> sources_;
  std::vector<TorchEntry> entries_;
  Strategy strategy_;
  CheckpointMeta meta_;
};

Result<std::unique_ptr<TorchSource>> OpenSource(const std::string& path,
                                                std::shared_ptr<RandomAccessFile> file,
                                                uint64_t base, uint64_t size,
                                                const std::string& where, bool keep_pickle) {
  auto src = std::make_unique<TorchSource>();
  src->path = path;
  src->file = std::move(file);
  ASSIGN_OR_RETURN(src->contents, ReadTorchSave(*src->file, base, size, where));
  if (!keep_pickle) src->contents.pickle = Pickle();
  return src;
}

}  // namespace

Result<std::unique_ptr<TorchSource>> OpenTorchSource(Env* env, const std::string& path,
                                                     bool keep_pickle) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  return OpenSource(path, std::move(file), 0, size, "'" + path + "'", keep_pickle);
}

Result<std::unique_ptr<CheckpointReader>> MakeTorchReader(
    const std::string& path, const std::string& format,
    std::vector<std::unique_ptr<TorchSource>> sources, std::vector<TorchEntry> entries,
    const std::vector<std::pair<std::string, std::string>>& values) {
  auto reader = std::make_unique<TorchReader>(path, format, std::move(sources));
  for (TorchEntry& e : entries) RETURN_IF_ERROR(reader->Add(std::move(e)));
  for (const auto& [k, v] : values) reader->AddValue(k, v);
  return std::unique_ptr<CheckpointReader>(std::move(reader));
}

namespace {

// Tessera's boxes have at most kMaxRank dimensions.
Status CheckRank(const std::string& path, const std::string& name, size_t rank) {
  if (rank <= static_cast<size_t>(kMaxRank)) return Status::Ok();
  return UnimplementedError("checkpoint '" + path + "': tensor '" + PrintableText(name) + "' has " +
                            std::to_string(rank) + " dimensions, more than the " +
                            std::to_string(kMaxRank) + " Tessera handles");
}

// Every tensor of every source whole, their other leaves as metadata.
Result<std::unique_ptr<CheckpointReader>> WholeTensors(
    const std::string& path, std::vector<std::unique_ptr<TorchSource>> sources) {
  std::vector<TorchEntry> entries;
  std::vector<std::pair<std::string, std::string>> values;
  for (size_t s = 0; s < sources.size(); ++s) {
    const TorchSaveFile& c = sources[s]->contents;
    for (size_t t = 0; t < c.tensors.size(); ++t) {
      const TorchTensor& tensor = c.tensors[t];
      RETURN_IF_ERROR(CheckRank(path, tensor.name, tensor.shape.size()));
      entries.push_back(
          {tensor.name, tensor.dtype, tensor.shape, {{s, t, Box::FromShape(tensor.shape)}}});
    }
    for (const TorchValue& v : c.values) values.emplace_back("torch." + v.name, v.text);
  }
  return MakeTorchReader(path, "torch", std::move(sources), std::move(entries), values);
}

// A Hugging Face index of pytorch_model shards: each file's tensors must be
// those the index gives it.
Result<std::vector<std::unique_ptr<TorchSource>>> OpenShards(Env* env, const std::string& path,
                                                             const std::string& index_path) {
  ASSIGN_OR_RETURN(WeightMapIndex index, ReadWeightMapIndex(env, index_path, false));
  const std::string dir = index_path.substr(0, index_path.find_last_of('/') + 1);
  std::vector<std::unique_ptr<TorchSource>> sources;
  size_t found = 0;
  for (const std::string& f : index.files) {
    ASSIGN_OR_RETURN(auto src, OpenTorchSource(env, dir + f));
    for (const TorchTensor& t : src->contents.tensors) {
      auto it = index.map.find(t.name);
      if (it == index.map.end() || it->second != f) {
        return DataLossError("torch checkpoint '" + path + "': tensor '" + PrintableText(t.name) +
                             "' of '" + PrintableText(f) + "' is not the index's");
      }
    }
    found += src->contents.tensors.size();
    sources.push_back(std::move(src));
  }
  if (found != index.map.size()) {
    return DataLossError("torch checkpoint '" + path + "': the index names " +
                         std::to_string(index.map.size()) + " tensors, its files hold " +
                         std::to_string(found));
  }
  return sources;
}

// One DCP item: a torch.save archive at its place in its file, holding one
// tensor.
// `max_bytes` bounds what a compressed item may inflate to (its chunk's
// bytes and the archive around them).
Result<std::unique_ptr<TorchSource>> OpenItem(
    Env* env, const std::string& dir, const DcpItem& item, uint64_t max_bytes,
    std::map<std::string, std::shared_ptr<RandomAccessFile>>* files) {
  std::shared_ptr<RandomAccessFile>& file = (*files)[item.file];
  const std::string path = JoinPath(dir, item.file);
  if (!file) {
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, env->NewRandomAccessFile(path));
    file = std::move(f);
  }
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (item.offset > size || item.length > size - item.offset) {
    return DataLossError("'" + path + "': an item at " + std::to_string(item.offset) + " (" +
                         std::to_string(item.length) + " bytes) runs past the file's " +
                         std::to_string(size) + " bytes");
  }
  const std::string where = "'" + path + "' item at " + std::to_string(item.offset);
  if (!item.zstd) return OpenSource(path, file, item.offset, item.length, where, false);
  // A "stream.zstd" item: decompressed into an unlinked temporary file (on
  // disk, so a large chunk costs no memory), read from there.
  const char* tmp = std::getenv("TMPDIR");
  std::string temp = JoinPath(tmp && *tmp ? tmp : "/tmp", "tessera-dcp-XXXXXX");
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) return InternalError(where + ": cannot create a temporary file in " + temp);
  ::close(fd);
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(auto out, env->NewWritableFile(temp));
    RETURN_IF_ERROR(DecompressZstdRange(*file, item.offset, item.length, max_bytes, *out, where));
    return out->Close();
  }();
  Result<std::unique_ptr<RandomAccessFile>> in =
      s.ok() ? env->NewRandomAccessFile(temp) : Result<std::unique_ptr<RandomAccessFile>>(s);
  (void)env->DeleteFile(temp);  // the open file stays readable
  if (!in.ok()) return in.status();
  std::shared_ptr<RandomAccessFile> inflated = std::move(*in);
  ASSIGN_OR_RETURN(uint64_t inflated_size, inflated->Size());
  return OpenSource(path, inflated, 0, inflated_size, where + " (zstd)", false);
}

// Megatron-LM's torch_dist directories are DCP plus metadata.json (the
// backends) and common.pt (a torch.save of what is not sharded: args, the
// iteration): their values become metadata "megatron.<path>", the
// iteration the step.
Status AddMegatronCommon(Env* env, const std::string& path,
                         std::vector<std::pair<std::string, std::string>>* values) {
  const std::string common = JoinPath(path, "common.pt");
  const std::string json = JoinPath(path, "metadata.json");
  if (env->FileExists(json)) {
    ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(json));
    if (size <= (64 << 10)) {
      ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, json));
      values->emplace_back("megatron.metadata.json", PrintableText(text));
    }
  }
  if (!env->FileExists(common)) return Status::Ok();
  ASSIGN_OR_RETURN(auto src, OpenTorchSource(env, common));
  for (const TorchValue& v : src->contents.values)
    values->emplace_back("megatron." + v.name, v.text);
  return Status::Ok();
}

}  // namespace

bool IsDcpCheckpoint(Env* env, const std::string& path) {
  const std::string md = JoinPath(path, kDcpMetadataName);
  if (!env->IsDirectory(path) || !env->FileExists(md)) return false;
  auto file = env->NewRandomAccessFile(md);
  if (!file.ok()) return false;
  auto size = (*file)->Size();
  std::string head(std::min<uint64_t>(size.ok() ? *size : 0, 256), '\0');
  return !head.empty() && (*file)->Read(0, head.size(), head.data()).ok() &&
         LooksLikeDcpMetadata(head);
}

Result<std::unique_ptr<CheckpointReader>> OpenDcpCheckpoint(Env* env, const std::string& path) {
  const std::string md_path = JoinPath(path, kDcpMetadataName);
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, md_path));
  ASSIGN_OR_RETURN(DcpMetadata md, ParseDcpMetadata(text, "'" + md_path + "'"));
  std::map<std::string, std::shared_ptr<RandomAccessFile>> files;
  std::vector<std::unique_ptr<TorchSource>> sources;
  std::vector<TorchEntry> entries;
  for (const DcpTensor& t : md.tensors) {
    RETURN_IF_ERROR(CheckRank(path, t.name, t.size.size()));
    TorchEntry e{t.name, t.dtype, t.size, {}};
    for (const DcpChunk& c : t.chunks) {
      auto elements = ShapeElements(c.sizes, t.dtype);
      if (!elements.ok()) {
        return DataLossError("DCP checkpoint '" + path + "': a chunk of '" + PrintableText(t.name) +
                             "': " + elements.status().message());
      }
      const uint64_t chunk_bytes = static_cast<uint64_t>(*elements) * DTypeSize(t.dtype);
      ASSIGN_OR_RETURN(auto src, OpenItem(env, path, c.item, chunk_bytes + (1 << 20), &files));
      if (src->contents.tensors.size() != 1) {
        return DataLossError("DCP checkpoint '" + path + "': the item of a chunk of '" +
                             PrintableText(t.name) + "' in '" + PrintableText(c.item.file) +
                             "' holds " + std::to_string(src->contents.tensors.size()) +
                             " tensors, not one");
      }
      Box box(static_cast<int>(c.offsets.size()));
      for (size_t d = 0; d < c.offsets.size() && d < c.sizes.size(); ++d) {
        box[d] = {c.offsets[d], c.offsets[d] + c.sizes[d]};
      }
      e.pieces.push_back({sources.size(), 0, box});
      sources.push_back(std::move(src));
    }
    entries.push_back(std::move(e));
  }
  std::vector<std::pair<std::string, std::string>> values;
  for (const DcpBytes& b : md.bytes) {
    values.emplace_back("dcp." + b.name, "bytes item, " + std::to_string(b.item.length) +
                                             " bytes at " + std::to_string(b.item.offset) + " of " +
                                             PrintableText(b.item.file));
  }
  RETURN_IF_ERROR(AddMegatronCommon(env, path, &values));
  return MakeTorchReader(path, "dcp", std::move(sources), std::move(entries), values);
}

bool IsTorchCheckpoint(Env* env, const std::string& path) {
  if (env->IsDirectory(path)) {
    return env->FileExists(JoinPath(path, kTorchIndexName)) ||
           env->FileExists(JoinPath(path, "pytorch_model.bin"));
  }
  auto file = env->NewRandomAccessFile(path);
  if (!file.ok()) return false;
  auto size = (*file)->Size();
  return size.ok() && LooksLikeTorchSave(**file, 0, *size);
}

Result<std::unique_ptr<CheckpointReader>> OpenTorchCheckpoint(Env* env, const std::string& path) {
  std::string index_path = path;
  if (env->IsDirectory(path)) {
    index_path = JoinPath(path, kTorchIndexName);
    if (!env->FileExists(index_path)) index_path = JoinPath(path, "pytorch_model.bin");
  }
  const bool is_index =
      index_path.size() > 5 && index_path.compare(index_path.size() - 5, 5, ".json") == 0;
  std::vector<std::unique_ptr<TorchSource>> sources;
  if (is_index) {
    ASSIGN_OR_RETURN(sources, OpenShards(env, path, index_path));
  } else {
    ASSIGN_OR_RETURN(auto src, OpenTorchSource(env, index_path));
    sources.push_back(std::move(src));
  }
  return WholeTensors(path, std::move(sources));
}

namespace {

// A torch.save archive of a planned output, at `base` of its file: its zip
// layout and which of its records hold tensors (their CRC-32s are patched
// at commit).
struct TorchArchivePlan {
  uint64_t base = 0;
  ZipLayout zip;
  std::vector<size_t> tensor_records;
  std::vector<uint64_t> tensor_sizes;
};

// Plans the archive of `pickle` and tensors of `tensor_sizes` bytes
// (records data/0, data/1, ...) at `base` of `file`, its fixed bytes added
// to the file's plan.
TorchArchivePlan PlanTorchArchive(const std::string& pickle,
                                  const std::vector<uint64_t>& tensor_sizes, uint64_t base,
                                  DenseFilePlan* file) {
  // The records as torch.save writes them (its archive name is "archive"
  // when it writes to a buffer; readers take any).
  std::vector<ZipRecordPlan> records = {
      {"archive/data.pkl", pickle.size(), Crc32(pickle.data(), pickle.size())},
      {"archive/byteorder", 6, Crc32("little", 6)}};
  TorchArchivePlan out;
  out.base = base;
  out.tensor_sizes = tensor_sizes;
  for (size_t k = 0; k < tensor_sizes.size(); ++k) {
    out.tensor_records.push_back(records.size());
    records.push_back({"archive/data/" + std::to_string(k), tensor_sizes[k], 0});
  }
  records.push_back({"archive/version", 2, Crc32("3\n", 2)});
  out.zip = PlanStoredZip(records, 64);
  for (size_t r = 0; r < records.size(); ++r)
    file->fixed.push_back({base + out.zip.header_offsets[r], out.zip.headers[r]});
  file->fixed.push_back({base + out.zip.data_offsets[0], pickle});
  file->fixed.push_back({base + out.zip.data_offsets[1], "little"});
  file->fixed.push_back({base + out.zip.data_offsets[records.size() - 1], "3\n"});
  file->fixed.push_back({base + out.zip.directory_offset, out.zip.directory});
  return out;
}

// The archives' tensor records' CRC-32s, from what was written.
Status PatchArchiveCrcs(Env* env, std::span<const TorchArchivePlan> archives,
                        const std::string& file_path, WritableFile& out) {
  ASSIGN_OR_RETURN(auto in, env->NewRandomAccessFile(file_path));
  for (const TorchArchivePlan& a : archives) {
    for (size_t k = 0; k < a.tensor_records.size(); ++k) {
      const size_t r = a.tensor_records[k];
      ASSIGN_OR_RETURN(uint32_t crc,
                       Crc32OfRange(*in, a.base + a.zip.data_offsets[r], a.tensor_sizes[k]));
      char le[4];
      PutLittleEndian<uint32_t>(le, crc);
      RETURN_IF_ERROR(out.WriteAt(a.base + a.zip.LocalCrcOffset(r), le, 4));
      RETURN_IF_ERROR(out.WriteAt(a.base + a.zip.CentralCrcOffset(r), le, 4));
    }
  }
  return Status::Ok();
}

Result<TorchArchivePlan> PlanTorchFile(const Strategy& strategy, const std::vector<size_t>& members,
                                       size_t file, DensePlan* plan, const std::string& name) {
  const std::vector<TensorStrategy>& tensors = strategy.tensors();
  std::vector<TorchWriteTensor> written;
  std::vector<uint64_t> sizes;
  for (size_t i : members) {
    written.push_back({tensors[i].name, tensors[i].layout.dtype, tensors[i].layout.shape});
    sizes.push_back(static_cast<uint64_t>(ByteSize(tensors[i].layout)));
  }
  ASSIGN_OR_RETURN(std::string pickle, TorchStateDictPickle(written));
  DenseFilePlan f{name, 0, {}};
  TorchArchivePlan out = PlanTorchArchive(pickle, sizes, 0, &f);
  f.size = out.zip.size;
  plan->files.push_back(std::move(f));
  for (size_t k = 0; k < members.size(); ++k) {
    plan->blocks[members[k]].push_back({static_cast<uint32_t>(file),
                                        out.zip.data_offsets[out.tensor_records[k]],
                                        Box::FromShape(tensors[members[k]].layout.shape),
                                        {}});
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<CheckpointWriter>> CreateTorchCheckpoint(Env* env, const std::string& path,
                                                                const Strategy& strategy,
                                                                const TorchWriteOptions& options) {
  const std::vector<TensorStrategy>& tensors = strategy.tensors();
  // Shards in tensor order, a new one when the next tensor would overflow.
  std::vector<std::vector<size_t>> shards(1);
  int64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t bytes = ByteSize(tensors[i].layout);
    if (options.max_shard_size > 0 && used > 0 && used + bytes > options.max_shard_size) {
      shards.emplace_back();
      used = 0;
    }
    used += bytes;
    shards.back().push_back(i);
  }
  DensePlan plan;
  plan.directory = options.max_shard_size > 0;
  plan.blocks.resize(tensors.size());
  std::vector<TorchArchivePlan> files;
  // Sorted, as Hugging Face writes its index (json.dumps(sort_keys=True)).
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "pytorch_model-%05zu-of-%05zu.bin", s + 1, shards.size());
    const std::string file = !plan.directory ? "" : shards.size() == 1 ? "pytorch_model.bin" : name;
    auto f = PlanTorchFile(strategy, shards[s], s, &plan, file);
    if (!f.ok()) return f.status().Annotate("output '" + path + "'");
    for (size_t i : shards[s]) {
      weight_map[tensors[i].name] = file;
      total += ByteSize(tensors[i].layout);
    }
    files.push_back(std::move(*f));
  }
  if (plan.directory && shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    plan.files.push_back({kTorchIndexName, text.size(), {{0, text}}});
  }
  plan.finalize = [env, files](size_t f, const std::string& file_path,
                               WritableFile& out) -> Status {
    if (f >= files.size()) return Status::Ok();  // the index
    return PatchArchiveCrcs(env, std::span(&files[f], 1), file_path, out);
  };
  return CreateDenseCheckpoint(env, path, strategy, std::move(plan), options.overwrite);
}

Result<std::unique_ptr<CheckpointWriter>> CreateDcpCheckpoint(Env* env, const std::string& path,
                                                              const Strategy& strategy,
                                                              bool overwrite) {
  const std::vector<TensorStrategy>& tensors = strategy.tensors();
  DensePlan plan;
  plan.directory = true;
  plan.blocks.resize(tensors.size());
  std::map<int64_t, size_t> file_of_rank;
  std::vector<std::vector<TorchArchivePlan>> archives;  // per file
  std::vector<DcpTensor> metadata;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Layout& layout = tensors[i].layout;
    auto groups = ReplicaGroups(layout, strategy.MeshOf(tensors[i]));
    if (!groups.ok()) return groups.status().Annotate("output '" + path + "'");
    DcpTensor t{tensors[i].name, layout.dtype, layout.shape, {}};
    for (const ReplicaGroup& g : *groups) {
      // Each piece once, in the file of the first rank holding it.
      auto [it, added] = file_of_rank.emplace(g.ranks[0], plan.files.size());
      if (added) {
        plan.files.push_back({"__" + std::to_string(g.ranks[0]) + "_0.distcp", 0, {}});
        archives.emplace_back();
      }
      DenseFilePlan& f = plan.files[it->second];
      const std::vector<int64_t> extents = g.box.extents();
      auto pickle = TorchTensorPickle({t.name, t.dtype, extents});
      if (!pickle.ok()) return pickle.status().Annotate("output '" + path + "'");
      const int64_t bytes = NumElements(g.box) * DTypeSize(t.dtype);
      const uint64_t base = (f.size + 63) / 64 * 64;
      TorchArchivePlan a = PlanTorchArchive(*pickle, {static_cast<uint64_t>(bytes)}, base, &f);
      f.size = base + a.zip.size;
      plan.blocks[i].push_back({static_cast<uint32_t>(it->second),
                                base + a.zip.data_offsets[a.tensor_records[0]],
                                g.box,
                                {}});
      DcpChunk chunk{{}, extents, {f.name, base, a.zip.size}};
      for (int d = 0; d < g.box.rank(); ++d) chunk.offsets.push_back(g.box[d].begin);
      t.chunks.push_back(std::move(chunk));
      archives[it->second].push_back(std::move(a));
    }
    metadata.push_back(std::move(t));
  }
  auto pickle = DcpMetadataPickle(metadata);
  if (!pickle.ok()) return pickle.status().Annotate("output '" + path + "'");
  plan.files.push_back({kDcpMetadataName, pickle->size(), {{0, *pickle}}});
  plan.finalize = [env, archives](size_t f, const std::string& file_path,
                                  WritableFile& out) -> Status {
    if (f >= archives.size()) return Status::Ok();  // .metadata
    return PatchArchiveCrcs(env, archives[f], file_path, out);
  };
  return CreateDenseCheckpoint(env, path, strategy, std::move(plan), overwrite);
}

}  // namespace tessera
