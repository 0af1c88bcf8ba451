#include "ckpt/checkpoint.h"

#include "core/buffer.h"

namespace tessera {

Status CheckNoViews(const Strategy& strategy, const std::string& where) {
  for (const TensorStrategy& t : strategy.tensors()) {
    if (!t.layout.view.empty()) {
      return UnimplementedError(where + ": tensor '" + t.name + "' is laid out over view " +
                                ShapeToString(t.layout.view) +
                                ", which only the native format stores (merge it, or write "
                                "native)");
    }
  }
  return Status::Ok();
}

namespace {
std::string Where(std::string_view kind, std::string_view path) {
  return std::string(kind) + " '" + std::string(path) + "'";
}
}  // namespace

Status CheckReadRegion(const TensorStrategy& t, std::string_view kind, std::string_view path,
                       const Box& region) {
  if (Contains(Box::FromShape(t.layout.split_shape()), region)) return Status::Ok();
  return OutOfRangeError(Where(kind, path) + ": tensor '" + t.name + "': box " + ToString(region) +
                         " lies outside " + (t.layout.view.empty() ? "shape " : "view ") +
                         ShapeToString(t.layout.split_shape()));
}

Result<const TensorStrategy*> CheckWritePiece(const Strategy& strategy, std::string_view kind,
                                              std::string_view path, size_t index, const Box& box) {
  if (index >= strategy.tensors().size()) {
    return InvalidArgumentError(Where(kind, path) + ": no tensor #" + std::to_string(index));
  }
  const TensorStrategy& t = strategy.tensors()[index];
  if (IsEmpty(box) || !Contains(Box::FromShape(t.layout.split_shape()), box)) {
    return InvalidArgumentError(Where(kind, path) + ": tensor '" + t.name + "': box " +
                                ToString(box) + " is empty or outside " +
                                (t.layout.view.empty() ? "shape " : "view ") +
                                ShapeToString(t.layout.split_shape()));
  }
  return &t;
}

Status ForEachCoarsePart(
    const Box& box, const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse,
    const std::function<Status(const Box& part, const std::vector<int64_t>& extents,
                               const Box& at)>& fn) {
  const auto groups = RefinementGroups(fine, coarse);
  if (!groups) {
    return InvalidArgumentError(ShapeToString(fine) + " does not refine " + ShapeToString(coarse));
  }
  if (IsEmpty(box) && box.rank() > 0) return Status::Ok();
  // Per coarse dimension: the pieces (coarse interval, place in the merged
  // dimension) the box's fine ranges make, merged where contiguous.
  struct Run {
    Interval coarse, at;
  };
  std::vector<std::vector<Run>> runs(coarse.size());
  std::vector<int64_t> extents(coarse.size());
  for (size_t d = 0; d < coarse.size(); ++d) {
    const auto [first, last] = (*groups)[d];  // the fine dimensions [first, last)
    extents[d] = 1;
    for (int j = first; j < last; ++j) extents[d] *= box[j].size();
    // Every index tuple of the group's outer dimensions, row-major.
    std::vector<int64_t> idx(last - 1 - first);
    for (int j = first; j < last - 1; ++j) idx[j - first] = box[j].begin;
    for (;;) {
      int64_t base = 0, pos = 0, stride = fine[last - 1], estride = box[last - 1].size();
      for (int j = last - 2; j >= first; --j) {
        base += idx[j - first] * stride;
        pos += (idx[j - first] - box[j].begin) * estride;
        stride *= fine[j];
        estride *= box[j].size();
      }
      const Run r{{base + box[last - 1].begin, base + box[last - 1].end},
                  {pos, pos + box[last - 1].size()}};
      if (!runs[d].empty() && runs[d].back().coarse.end == r.coarse.begin &&
          runs[d].back().at.end == r.at.begin) {
        runs[d].back().coarse.end = r.coarse.end;
        runs[d].back().at.end = r.at.end;
      } else {
        runs[d].push_back(r);
      }
      int j = last - 2;
      while (j >= first && ++idx[j - first] == box[j].end) {
        idx[j - first] = box[j].begin;
        --j;
      }
      if (j < first) break;
    }
  }
  // The product of the per-dimension runs.
  std::vector<size_t> pick(coarse.size(), 0);
  Box part(static_cast<int>(coarse.size())), at(static_cast<int>(coarse.size()));
  for (;;) {
    for (size_t d = 0; d < coarse.size(); ++d) {
      part[d] = runs[d][pick[d]].coarse;
      at[d] = runs[d][pick[d]].at;
    }
    RETURN_IF_ERROR(fn(part, extents, at));
    int d = static_cast<int>(coarse.size()) - 1;
    while (d >= 0 && ++pick[d] == runs[d].size()) pick[d--] = 0;
    if (d < 0) return Status::Ok();
  }
}

Status CheckpointReader::ReadRegions(const std::vector<RegionRead>& reads) const {
  for (const RegionRead& r : reads) {
    const std::vector<int64_t> ext = r.region.extents();
    RETURN_IF_ERROR(ReadRegion(r.index, r.region, r.dst, ext, Box::FromShape(ext)));
  }
  return Status::Ok();
}

Status ReadRegionOver(const CheckpointReader& reader, size_t index,
                      const std::vector<int64_t>& coords, const Box& region, void* dst) {
  const Layout& layout = reader.strategy().tensors()[index].layout;
  const std::vector<int64_t>& own = layout.split_shape();
  const std::vector<int64_t> ext = region.extents();
  if (coords == own) return reader.ReadRegion(index, region, dst, ext, Box::FromShape(ext));
  if (region == Box::FromShape(coords)) {  // the whole tensor: the same bytes in any shape
    const Box whole = Box::FromShape(own);
    return reader.ReadRegion(index, whole, dst, own, whole);
  }
  return ForEachCoarsePart(
             region, coords, own,
             [&](const Box& part, const std::vector<int64_t>& extents, const Box& at) {
               return reader.ReadRegion(index, part, dst, extents, at);
             })
      .Annotate("tensor '" + reader.strategy().tensors()[index].name + "'");
}

Status CheckpointWriter::WritePieces(const std::vector<PieceWrite>& pieces) {
  for (const PieceWrite& p : pieces)
    RETURN_IF_ERROR(WritePiece(p.index, p.shard_rank, p.box, p.data));
  return Status::Ok();
}

Status WritePieceOver(CheckpointWriter& writer, const Layout& layout, size_t index,
                      int64_t shard_rank, const std::vector<int64_t>& coords, const Box& box,
                      const void* data) {
  const std::vector<int64_t>& own = layout.split_shape();
  if (coords == own) return writer.WritePiece(index, shard_rank, box, data);
  const int64_t es = DTypeSize(layout.dtype);
  return ForEachCoarsePart(
      box, coords, own,
      [&](const Box& part, const std::vector<int64_t>& extents, const Box& at) -> Status {
        if (IsEmpty(part)) return Status::Ok();
        const std::vector<int64_t> pext = part.extents();
        ASSIGN_OR_RETURN(auto tmp, AllocateBytesFor(NumElements(part) * es, [&] {
                           return "a piece of " + ToString(part);
                         }));
        CopyBox(data, extents, at, tmp.get(), pext, Box::FromShape(pext), es);
        return writer.WritePiece(index, shard_rank, part, tmp.get());
      });
}

Status ReadTensor(const CheckpointReader& reader, size_t index, void* dst) {
  const Layout& layout = reader.strategy().tensors()[index].layout;
  if (NumElements(layout) == 0) return Status::Ok();
  const Box whole = Box::FromShape(layout.split_shape());
  return reader.ReadRegion(index, whole, dst, layout.split_shape(), whole);
}

Result<size_t> FindTensor(const CheckpointReader& reader, std::string_view name) {
  const auto& tensors = reader.strategy().tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return NotFoundError("checkpoint '" + reader.path() + "' has no tensor '" + std::string(name) +
                       "'");
}

}  // namespace tessera
