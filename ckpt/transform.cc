#include "ckpt/transform.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "core/buffer.h"
#include "core/thread_pool.h"
#include "transform/reshard_plan.h"

namespace tessera {

Result<Strategy> CompleteStrategy(const Strategy& src, const Strategy& dst) {
  for (const TensorStrategy& t : dst.tensors()) {
    if (src.Find(t.name) == nullptr) {
      return NotFoundError("the destination strategy names tensor '" + t.name +
                           "', which the checkpoint does not have");
    }
  }
  Strategy out(dst.mesh());
  for (const TensorStrategy& t : src.tensors()) {
    const TensorStrategy* d = dst.Find(t.name);
    if (d != nullptr) {
      RETURN_IF_ERROR(out.Add(*d));
    } else {
      RETURN_IF_ERROR(out.Add({t.name, Layout::Replicated(t.layout.shape, t.layout.dtype), {}}));
    }
  }
  return out;
}

Strategy MergedStrategy(const Strategy& src) {
  Strategy out(*Mesh::Create({"r"}, {1}));
  for (const TensorStrategy& t : src.tensors()) {
    (void)out.Add({t.name, Layout::Replicated(t.layout.shape, t.layout.dtype), {}});
  }
  return out;
}

std::vector<Box> SplitBox(const Box& box, int64_t es, int64_t max_bytes) {
  const int rank = box.rank();
  if (NumElements(box) * es <= max_bytes || rank == 0) return {box};
  // The outermost dimension d whose inner rows fit: slabs cut along d, one
  // index at a time along the dimensions before it.
  int d = 0;
  int64_t inner = es;  // bytes of one index of dimension d
  for (int k = rank - 1; k >= 0; --k) {
    if (inner * box[k].size() > max_bytes) {
      d = k;
      break;
    }
    inner *= box[k].size();
  }
  const int64_t step = std::max<int64_t>(1, max_bytes / inner);
  std::vector<Box> out;
  std::vector<int64_t> idx(d, 0);
  while (true) {
    Box slab = box;
    for (int k = 0; k < d; ++k) slab[k] = {box[k].begin + idx[k], box[k].begin + idx[k] + 1};
    for (int64_t b = box[d].begin; b < box[d].end; b += step) {
      slab[d] = {b, std::min(b + step, box[d].end)};
      out.push_back(slab);
    }
    int k = d - 1;
    while (k >= 0 && ++idx[k] == box[k].size()) idx[k--] = 0;
    if (k < 0) break;
  }
  return out;
}

namespace {

// A piece smaller than this is gathered with its neighbours into one slab
// rather than copied on its own (one write call each).
constexpr int64_t kDirectMinBytes = int64_t{256} << 10;

// `box`, relative to `base`, in global coordinates.
Box Shift(const Box& box, const Box& base) {
  Box out = box;
  for (int d = 0; d < box.rank(); ++d) {
    out[d] = {box[d].begin + base[d].begin, box[d].end + base[d].begin};
  }
  return out;
}

}  // namespace

Result<TransformStats> Transform(const CheckpointReader& src, const Strategy& dst,
                                 CheckpointWriter& out, const TransformOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Strategy& from = src.strategy();
  if (dst.tensors().size() != from.tensors().size()) {
    return InvalidArgumentError("the destination strategy has " +
                                std::to_string(dst.tensors().size()) + " tensors, checkpoint '" +
                                src.path() + "' has " + std::to_string(from.tensors().size()));
  }
  PlanOptions plan_options;
  plan_options.one_per_replica_group = true;
  ASSIGN_OR_RETURN(ReshardPlan plan, PlanReshard(from, dst, plan_options));

  ThreadPool pool(options.threads);
  // Each worker holds one slab and, at worst, a staged source piece or an
  // encoded copy of the slab: a third of its share of the budget per slab.
  const int64_t slab_limit =
      std::max<int64_t>(int64_t{64} << 10, options.memory_budget / (3 * pool.size()));

  struct Item {
    size_t tensor;
    int64_t rank;
    Box box;
    bool direct;  // one source piece's contiguous bytes: try ViewRegion
  };
  std::vector<Item> items;
  TransformStats stats;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& tp = plan.tensors[i];
    if (dst.tensors()[i].name != from.tensors()[i].name) {
      return InvalidArgumentError("the destination strategy lists tensor '" +
                                  dst.tensors()[i].name + "' where checkpoint '" + src.path() +
                                  "' has '" + from.tensors()[i].name + "'");
    }
    const int64_t es = DTypeSize(tp.dtype);
    // Copied without a staging buffer when the source lends its bytes: a
    // shard whose every piece is one contiguous run of it (rows of a
    // row-split tensor), in the same coordinates on both sides.
    const bool same_coords = tp.src_layout.split_shape() == from.tensors()[i].layout.split_shape() &&
                             tp.src_layout.split_shape() == dst.tensors()[i].layout.split_shape();
    for (const ShardPlan& shard : tp.shards) {
      const std::vector<int64_t> ext = shard.shard.extents();
      bool direct = same_coords && shard.copies.size() > 1;
      for (const PieceCopy& c : shard.copies) {
        direct = direct && NumElements(c.dst_box) * es >= kDirectMinBytes &&
                 ByteRuns(ext, c.dst_box, ext, c.dst_box, es).size() == 1;
      }
      std::vector<Box> boxes;
      if (direct) {
        for (const PieceCopy& c : shard.copies) boxes.push_back(Shift(c.dst_box, shard.shard));
      } else {
        boxes.push_back(shard.shard);
      }
      for (const Box& box : boxes) {
        for (const Box& slab : SplitBox(box, es, slab_limit)) {
          items.push_back({i, shard.dst_rank, slab, direct || shard.copies.size() == 1});
          stats.bytes += NumElements(slab) * es;
        }
      }
    }
  }
  stats.tensors = static_cast<int64_t>(plan.tensors.size());
  stats.pieces = static_cast<int64_t>(items.size());

  BufferPool buffers;
  std::mutex progress_mu;
  int64_t done = 0;
  const int64_t total = stats.bytes;
  if (options.progress) options.progress(0, total);
  RETURN_IF_ERROR(pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t k) -> Status {
    const Item& item = items[k];
    const TensorStrategy& t = dst.tensors()[item.tensor];
    const int64_t bytes = NumElements(item.box) * DTypeSize(t.layout.dtype);
    // The plan's boxes are over its coordinates (the finer view when the
    // source and destination split different views of the tensor).
    const std::vector<int64_t>& coords = plan.tensors[item.tensor].src_layout.split_shape();
    std::unique_ptr<FileView> view;
    if (item.direct && coords == from.tensors()[item.tensor].layout.split_shape()) {
      ASSIGN_OR_RETURN(view, src.ViewRegion(item.tensor, item.box));
    }
    if (view != nullptr) {
      RETURN_IF_ERROR(WritePieceOver(out, t.layout, item.tensor, item.rank, coords, item.box,
                                     view->data()));
    } else {
      ASSIGN_OR_RETURN(auto buf,
                       buffers.Get(bytes, "tensor '" + t.name + "' " + ToString(item.box)));
      RETURN_IF_ERROR(ReadRegionOver(src, item.tensor, coords, item.box, buf.get()));
      RETURN_IF_ERROR(WritePieceOver(out, t.layout, item.tensor, item.rank, coords, item.box,
                                     buf.get()));
    }
    if (options.progress) {
      std::lock_guard<std::mutex> lock(progress_mu);
      done += bytes;
      options.progress(done, total);
    }
    return Status::Ok();
  }));
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace tessera
