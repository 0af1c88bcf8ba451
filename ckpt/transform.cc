#include "ckpt/transform.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"
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

// Bytes of items read in one batch (ReadRegions): a task of small pieces
// in one or a few, the buffer still in the cache when they are written.
constexpr int64_t kBatchBytes = int64_t{1} << 20;
// An item's bytes in a batch's buffer: each starts on a cache line.
int64_t Padded(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// `box`, relative to `base`, in global coordinates.
Box Shift(const Box& box, const Box& base) {
  Box out = box;
  for (int d = 0; d < box.rank(); ++d) {
    out[d] = {box[d].begin + base[d].begin, box[d].end + base[d].begin};
  }
  return out;
}

// What to copy, one item per destination box: compact, since a
// checkpoint of thousands of ranks has hundreds of thousands.
struct Item {
  uint32_t tensor;
  bool direct;   // one source piece's contiguous bytes: try ViewRegion
  uint32_t box;  // its box: boxes[box .. box + 2 * rank), begins then ends
  int64_t rank;
};

// The items of every tensor, by destination rank (each rank's tensors in
// order), with their boxes.
struct Items {
  std::vector<Item> items;
  std::vector<int64_t> boxes;
  // Each tensor's plan coordinates (the finer view when the source and
  // destination split different views of it).
  std::vector<std::vector<int64_t>> coords;
  int64_t bytes = 0;

  // An item's box, over its tensor's coords.
  Box BoxOf(const Item& item) const {
    const int rank = static_cast<int>(coords[item.tensor].size());
    Box box(rank);
    for (int d = 0; d < rank; ++d) box[d] = {boxes[item.box + d], boxes[item.box + rank + d]};
    return box;
  }
};

// Plans each tensor on the pool, a tensor per task, and joins the items in
// destination rank order. Each tensor's plan is dropped once its boxes are
// taken: the plan's source boxes are the reader's business. Which replicas
// to read from is not planned either: the reader reads whichever piece
// holds a box.
Result<Items> PlanItems(const CheckpointReader& src, const Strategy& dst, ThreadPool& pool,
                        int64_t slab_limit) {
  const Strategy& from = src.strategy();
  PlanOptions plan_options;
  plan_options.one_per_replica_group = true;
  plan_options.pick_sources = false;
  struct Planned {
    std::vector<Item> items;
    std::vector<int64_t> boxes;
    int64_t bytes = 0;
  };
  std::vector<Planned> planned(dst.tensors().size());
  Items out;
  out.coords.resize(from.tensors().size());
  RETURN_IF_ERROR(pool.ParallelFor(static_cast<int64_t>(planned.size()), [&](int64_t ti) -> Status {
    const size_t i = static_cast<size_t>(ti);
    const TensorStrategy& d = dst.tensors()[i];
    const TensorStrategy& f = from.tensors()[i];
    if (d.name != f.name) {
      return InvalidArgumentError("the destination strategy lists tensor '" + d.name +
                                  "' where checkpoint '" + src.path() + "' has '" + f.name + "'");
    }
    ASSIGN_OR_RETURN(TensorPlan tp,
                     PlanTensorReshard(d.name, from.MeshOf(f), f.layout, dst.MeshOf(d), d.layout,
                                       plan_options, nullptr));
    const int64_t es = DTypeSize(tp.dtype);
    std::vector<int64_t>& coords = out.coords[i];
    coords = tp.src_layout.split_shape();
    Planned& p = planned[i];
    // Copied without a staging buffer when the source lends its bytes: a
    // shard whose every piece is one contiguous run of it (rows of a
    // row-split tensor), in the same coordinates on both sides.
    const bool same_coords = coords == f.layout.split_shape() && coords == d.layout.split_shape();
    for (const ShardPlan& shard : tp.shards) {
      const std::vector<int64_t> ext = shard.shard.extents();
      bool direct = same_coords && shard.copies.size() > 1;
      for (const PieceCopy& c : shard.copies) {
        direct = direct && NumElements(c.dst_box) * es >= kDirectMinBytes &&
                 ByteRuns(ext, c.dst_box, ext, c.dst_box, es).size() == 1;
      }
      std::vector<Box> parts;
      if (direct) {
        for (const PieceCopy& c : shard.copies) parts.push_back(Shift(c.dst_box, shard.shard));
      } else {
        parts.push_back(shard.shard);
      }
      for (const Box& box : parts) {
        for (const Box& slab : SplitBox(box, es, slab_limit)) {
          p.items.push_back({static_cast<uint32_t>(i), direct || shard.copies.size() == 1,
                             static_cast<uint32_t>(p.boxes.size()), shard.dst_rank});
          for (int k = 0; k < slab.rank(); ++k) p.boxes.push_back(slab[k].begin);
          for (int k = 0; k < slab.rank(); ++k) p.boxes.push_back(slab[k].end);
          p.bytes += NumElements(slab) * es;
        }
      }
    }
    return Status::Ok();
  }));
  // Joined in destination rank order (each rank's tensors in order), the
  // items placed by counting (a stable sort by rank, without sorting a
  // million and a half items on one thread).
  int64_t min_rank = INT64_MAX, max_rank = INT64_MIN;
  size_t n_items = 0, n_bounds = 0;
  for (const Planned& p : planned) {
    n_items += p.items.size();
    n_bounds += p.boxes.size();
    for (const Item& item : p.items) {
      min_rank = std::min(min_rank, item.rank);
      max_rank = std::max(max_rank, item.rank);
    }
  }
  if (n_bounds > UINT32_MAX) {
    return ResourceExhaustedError("checkpoint '" + src.path() + "': too many pieces to plan");
  }
  out.items.resize(n_items);
  out.boxes.reserve(n_bounds);
  // Where each rank's items start (ranks counted from min_rank).
  std::vector<size_t> next;
  if (n_items > 0) {
    next.assign(static_cast<size_t>(max_rank - min_rank) + 1, 0);
    for (const Planned& p : planned) {
      for (const Item& item : p.items) ++next[static_cast<size_t>(item.rank - min_rank)];
    }
    size_t at = 0;
    for (size_t& n : next) at += std::exchange(n, at);
  }
  for (Planned& p : planned) {
    const uint32_t at = static_cast<uint32_t>(out.boxes.size());
    for (Item item : p.items) {
      item.box += at;
      out.items[next[static_cast<size_t>(item.rank - min_rank)]++] = item;
    }
    out.boxes.insert(out.boxes.end(), p.boxes.begin(), p.boxes.end());
    out.bytes += p.bytes;
    p = Planned();
  }
  return out;
}

// The items cut into tasks of a few consecutive destination ranks: a data
// file is filled by one worker at a time, its small pieces gathered into
// large writes, and handed back (Flush) when the worker is done with it. A
// task takes up to kTaskRanks whole ranks while it holds under kTaskBytes
// (each rank in it keeps a staging buffer of its file until the task
// ends); a rank of more bytes is cut into tasks of its own. Returns
// [begin, end) of each task's items.
std::vector<std::pair<size_t, size_t>> CutTasks(const Items& plan, const Strategy& dst) {
  constexpr int64_t kTaskBytes = int64_t{16} << 20;
  constexpr int kTaskRanks = 2;
  std::vector<std::pair<size_t, size_t>> tasks;
  const std::vector<Item>& items = plan.items;
  int64_t task_bytes = 0;
  int task_ranks = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const bool new_rank = k == 0 || items[k].rank != items[k - 1].rank;
    if (tasks.empty() || task_bytes >= kTaskBytes ||
        (new_rank && (task_ranks == kTaskRanks || task_bytes >= kTaskBytes / kTaskRanks))) {
      tasks.push_back({k, k});
      task_bytes = 0;
      task_ranks = 0;
    }
    if (new_rank || task_ranks == 0) ++task_ranks;
    ++tasks.back().second;
    const int64_t es = DTypeSize(dst.tensors()[items[k].tensor].layout.dtype);
    task_bytes += NumElements(plan.BoxOf(items[k])) * es;
  }
  return tasks;
}

// What the tasks of one Transform share: the source, the destination, the
// items, the staging buffers and the progress count.
struct TransformJob {
  const CheckpointReader& src;
  const Strategy& dst;
  CheckpointWriter& out;
  const TransformOptions& options;
  const Items& plan;
  int64_t batch_limit;  // a batch holds no more than a slab
  BufferPool buffers;
  std::mutex progress_mu;
  int64_t done = 0;

  void AddProgress(int64_t bytes) {
    if (!options.progress) return;
    std::lock_guard<std::mutex> lock(progress_mu);
    done += bytes;
    options.progress(done, plan.bytes);
  }
};

// One task's items copied. Within a task the items go by tensor, then rank
// (each rank's own order kept, so its file is the same): neighbouring
// ranks that take parts of the same small source pieces (tp 8 -> 16
// halves each) then read them in one batch (ReadRegions), each piece read
// and verified once. Items are read in batches into one buffer, then
// written in the task's order (WritePieces). A batch holds up to
// batch_limit, or one larger item; an item the source lends its bytes
// for, or one over another view of its tensor, goes on its own.
class TransformTask {
 public:
  TransformTask(TransformJob& job, std::span<Item> items) : job_(job), items_(items) {}

  Status Run() {
    std::stable_sort(items_.begin(), items_.end(),
                     [](const Item& a, const Item& b) { return a.tensor < b.tensor; });
    const Strategy& from = job_.src.strategy();
    for (const Item& item : items_) {
      const TensorStrategy& ts = job_.dst.tensors()[item.tensor];
      const std::vector<int64_t>& c = job_.plan.coords[item.tensor];
      const bool own = c == from.tensors()[item.tensor].layout.split_shape();
      const Box box = job_.plan.BoxOf(item);
      const int64_t bytes = NumElements(box) * DTypeSize(ts.layout.dtype);
      std::unique_ptr<FileView> view;
      // A box smaller than kViewAtLeast is copied, never lent (a mapping
      // costs more than the copy): not worth asking for.
      if (item.direct && bytes >= static_cast<int64_t>(kViewAtLeast) && own) {
        ASSIGN_OR_RETURN(view, job_.src.ViewRegion(item.tensor, box));
      }
      // The items before it are written first: each file gets its pieces
      // in the task's order.
      if (view != nullptr || !own) RETURN_IF_ERROR(FlushBatch());
      if (view != nullptr) {
        RETURN_IF_ERROR(Write(item, box, view->data()));
        job_.AddProgress(bytes);
      } else if (own) {
        const int64_t padded = Padded(bytes);
        if (!batch_.empty() && batch_bytes_ + padded > job_.batch_limit) {
          RETURN_IF_ERROR(FlushBatch());
        }
        batch_.push_back({item.tensor, box, nullptr});
        batch_items_.push_back(&item);
        batch_bytes_ += padded;
      } else {
        Result<BufferPool::Lease> buf = job_.buffers.Get(bytes, "a slab");
        if (!buf.ok()) return buf.status().Annotate("tensor '" + ts.name + "' " + ToString(box));
        RETURN_IF_ERROR(ReadRegionOver(job_.src, item.tensor, c, box, buf->get()));
        RETURN_IF_ERROR(Write(item, box, buf->get()));
        job_.AddProgress(bytes);
      }
    }
    RETURN_IF_ERROR(FlushBatch());
    // Every rank the task wrote to (a few; its items are by tensor now, so
    // any of them may name a rank first).
    std::vector<int64_t> ranks;
    for (const Item& item : items_) {
      if (std::find(ranks.begin(), ranks.end(), item.rank) == ranks.end()) {
        ranks.push_back(item.rank);
      }
    }
    for (int64_t rank : ranks) RETURN_IF_ERROR(job_.out.Flush(rank));
    return Status::Ok();
  }

 private:
  Status Write(const Item& item, const Box& box, const void* data) {
    const TensorStrategy& ts = job_.dst.tensors()[item.tensor];
    return WritePieceOver(job_.out, ts.layout, item.tensor, item.rank,
                          job_.plan.coords[item.tensor], box, data);
  }

  // The batch read into one buffer, then written.
  Status FlushBatch() {
    if (batch_.empty()) return Status::Ok();
    Result<BufferPool::Lease> buf = job_.buffers.Get(static_cast<size_t>(batch_bytes_), "a batch");
    if (!buf.ok()) {
      const Item& first = *batch_items_[0];
      return buf.status().Annotate("tensor '" + job_.dst.tensors()[first.tensor].name + "' " +
                                   ToString(job_.plan.BoxOf(first)));
    }
    int64_t at = 0, bytes = 0;
    for (CheckpointReader::RegionRead& r : batch_) {
      r.dst = buf->get() + at;
      const int64_t n = NumElements(r.region) * DTypeSize(job_.dst.tensors()[r.index].layout.dtype);
      at += Padded(n);
      bytes += n;
    }
    RETURN_IF_ERROR(job_.src.ReadRegions(batch_));
    // Written as one batch (WritePieces: each file's lock taken once), but
    // for a box over a finer view than the destination's, which
    // WritePieceOver cuts: the batch up to it goes first.
    for (size_t b = 0; b < batch_.size(); ++b) {
      const Item& item = *batch_items_[b];
      if (job_.plan.coords[item.tensor] == job_.dst.tensors()[item.tensor].layout.split_shape()) {
        writes_.push_back({item.tensor, item.rank, batch_[b].region, batch_[b].dst});
        continue;
      }
      RETURN_IF_ERROR(job_.out.WritePieces(writes_));
      writes_.clear();
      RETURN_IF_ERROR(Write(item, batch_[b].region, batch_[b].dst));
    }
    RETURN_IF_ERROR(job_.out.WritePieces(writes_));
    writes_.clear();
    job_.AddProgress(bytes);
    batch_.clear();
    batch_items_.clear();
    batch_bytes_ = 0;
    return Status::Ok();
  }

  TransformJob& job_;
  std::span<Item> items_;
  std::vector<CheckpointReader::RegionRead> batch_;
  std::vector<const Item*> batch_items_;  // the items of batch_
  std::vector<CheckpointWriter::PieceWrite> writes_;
  int64_t batch_bytes_ = 0;
};

}  // namespace

Result<TransformStats> Transform(const CheckpointReader& src, const Strategy& dst,
                                 CheckpointWriter& out, const TransformOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (dst.tensors().size() != src.strategy().tensors().size()) {
    return InvalidArgumentError("the destination strategy has " +
                                std::to_string(dst.tensors().size()) + " tensors, checkpoint '" +
                                src.path() + "' has " +
                                std::to_string(src.strategy().tensors().size()));
  }
  ThreadPool pool(options.threads);
  // Each worker holds one slab and, at worst, a staged source piece or an
  // encoded copy of the slab: a third of its share of the budget per slab.
  const int64_t slab_limit =
      std::max<int64_t>(int64_t{64} << 10, options.memory_budget / (3 * pool.size()));
  ASSIGN_OR_RETURN(Items plan, PlanItems(src, dst, pool, slab_limit));
  TransformStats stats;
  stats.tensors = static_cast<int64_t>(dst.tensors().size());
  stats.pieces = static_cast<int64_t>(plan.items.size());
  stats.bytes = plan.bytes;
  const std::vector<std::pair<size_t, size_t>> tasks = CutTasks(plan, dst);
  TransformJob job{src, dst, out, options, plan, std::min(kBatchBytes, slab_limit)};
  if (options.progress) options.progress(0, plan.bytes);
  RETURN_IF_ERROR(pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t) -> Status {
    std::span<Item> items(plan.items.data() + tasks[t].first, tasks[t].second - tasks[t].first);
    return TransformTask(job, items).Run();
  }));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace tessera
