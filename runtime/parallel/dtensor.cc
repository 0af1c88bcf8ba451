#include "runtime/parallel/dtensor.h"

#include <cstring>

#include "transform/reshard_plan.h"

namespace tessera {
namespace {

// When every rank holds the next block of whole rows of the source, in rank
// order and once each, and every rank wants the whole tensor (FSDP's
// unshard): each rank's bytes in the result, as AllGatherV places them.
Result<std::optional<std::vector<int64_t>>> RowBlocksInRankOrder(const Mesh& mesh,
                                                                 const Layout& from,
                                                                 const Mesh& target_mesh,
                                                                 const Layout& to) {
  const std::optional<std::vector<int64_t>> none;
  const std::vector<int64_t>& shape = from.split_shape();
  if (shape.empty() || !to.stage_axis.empty() || !from.stage_axis.empty()) return none;
  ASSIGN_OR_RETURN(ShardGrid target, ShardGrid::Create(target_mesh, to));
  if (target.num_pieces() != 1) return none;  // not replicated
  ASSIGN_OR_RETURN(ShardGrid grid, ShardGrid::Create(mesh, from));
  const int64_t row = DTypeSize(from.dtype) * (NumElements(from) / std::max<int64_t>(1, shape[0]));
  std::vector<int64_t> counts;
  int64_t next = 0;
  for (int64_t r = 0; r < mesh.world_size(); ++r) {
    const std::optional<Box> b = grid.ShardOf(r);
    if (!b || (*b)[0].begin != next) return none;
    for (size_t d = 1; d < shape.size(); ++d) {
      if ((*b)[d].size() != shape[d]) return none;
    }
    next = (*b)[0].end;
    counts.push_back((*b)[0].size() * row);
  }
  if (next != shape[0]) return none;
  return std::optional<std::vector<int64_t>>(std::move(counts));
}

}  // namespace

Status DTensor::Reset(const Mesh& mesh, Layout layout, int64_t rank) {
  ASSIGN_OR_RETURN(std::optional<Box> box, ShardOf(layout, mesh, rank));
  mesh_ = mesh;
  rank_ = rank;
  holds_ = box.has_value();
  box_ = box ? *box : Box(layout.rank());
  local_.resize(holds_ ? NumElements(*box) * DTypeSize(layout.dtype) : 0);
  layout_ = std::move(layout);
  return Status::Ok();
}

Result<DTensor> DTensor::FromLocal(const Mesh& mesh, Layout layout, int64_t rank,
                                   std::vector<char> local) {
  DTensor t;
  const size_t given = local.size();
  t.local_ = std::move(local);
  RETURN_IF_ERROR(t.Reset(mesh, std::move(layout), rank));
  if (t.local_.size() != given) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " holds " +
                                (t.holds_ ? ToString(t.box_) : std::string("nothing")) + " of " +
                                ToString(t.layout_) + ": " + std::to_string(t.local_.size()) +
                                " bytes, given " + std::to_string(given));
  }
  return t;
}

Result<DTensor> DTensor::FromFull(const Mesh& mesh, Layout layout, const void* full, int64_t rank) {
  ASSIGN_OR_RETURN(std::optional<Box> box, ShardOf(layout, mesh, rank));
  std::vector<char> local;
  if (box) {
    const int64_t es = DTypeSize(layout.dtype);
    local.resize(NumElements(*box) * es);
    CopyBox(full, layout.split_shape(), *box, local.data(), box->extents(),
            Box::FromShape(box->extents()), es);
  }
  return FromLocal(mesh, std::move(layout), rank, std::move(local));
}

Status RedistributeInto(const DTensor& t, const Mesh& target_mesh, const Layout& target,
                        Communicator& comm, DTensor* out, RedistributeStats* stats) {
  if (out == &t) return InvalidArgumentError("redistribute: the output is the input");
  const int64_t world = comm.size();
  if (t.mesh().world_size() != world || target_mesh.world_size() != world) {
    return InvalidArgumentError("redistribute over " + std::to_string(world) + " ranks: mesh " +
                                t.mesh().ToString() + " -> " + target_mesh.ToString());
  }
  if (t.rank() != comm.rank()) {
    return InvalidArgumentError("the tensor is rank " + std::to_string(t.rank()) +
                                "'s shard, this is rank " + std::to_string(comm.rank()));
  }
  // FSDP's unshard (row blocks in rank order -> replicated) is one
  // AllGatherV straight into the result: no packing.
  ASSIGN_OR_RETURN(auto blocks, RowBlocksInRankOrder(t.mesh(), t.layout(), target_mesh, target));
  if (blocks && target.shape == t.layout().shape && target.dtype == t.layout().dtype) {
    RETURN_IF_ERROR(out->Reset(target_mesh, target, comm.rank()));
    RETURN_IF_ERROR(
        comm.AllGatherV(t.local().data(), (*blocks)[comm.rank()], out->local().data(), *blocks,
                        DType::kU8)
            .Annotate("redistribute " + ToString(t.layout()) + " -> " + ToString(target)));
    if (stats != nullptr) {
      const int64_t mine = (*blocks)[comm.rank()];
      *stats = {mine * (world - 1), static_cast<int64_t>(out->local().size()) - mine, mine};
    }
    return Status::Ok();
  }
  // Every rank plans the same (deterministic) copies; local pieces first.
  std::vector<int64_t> load;
  ASSIGN_OR_RETURN(TensorPlan plan, PlanTensorReshard("tensor", t.mesh(), t.layout(), target_mesh,
                                                      target, {.prefer_local = true}, &load));
  const int64_t me = comm.rank();
  const int64_t es = DTypeSize(target.dtype);
  // The source shard in the plan's coordinates (the same bytes whatever the
  // view: only its extents may differ).
  ASSIGN_OR_RETURN(std::optional<Box> src_box, ShardOf(plan.src_layout, t.mesh(), me));
  const std::vector<int64_t> src_ext = src_box ? src_box->extents() : std::vector<int64_t>{};
  const char* src = t.local().data();

  // Pack what others need from here: for each destination rank, its copies
  // from this rank in plan order.
  std::vector<int64_t> send_counts(world, 0), recv_counts(world, 0);
  thread_local std::vector<char> send, recv;  // kept between calls (see the header)
  send.clear();
  const ShardPlan* mine = nullptr;
  RedistributeStats s;
  for (const ShardPlan& sp : plan.shards) {
    if (sp.dst_rank == me) mine = &sp;
    for (const PieceCopy& c : sp.copies) {
      const int64_t bytes = NumElements(c.src_box) * es;
      if (sp.dst_rank == me) {
        if (c.src_rank == me) {
          s.local_bytes += bytes;
        } else {
          recv_counts[c.src_rank] += bytes;
        }
        continue;
      }
      if (c.src_rank != me) continue;
      const size_t at = send.size();
      send.resize(at + bytes);
      CopyBox(src, src_ext, c.src_box, send.data() + at, c.src_box.extents(),
              Box::FromShape(c.src_box.extents()), es);
      send_counts[sp.dst_rank] += bytes;
    }
  }
  int64_t total_recv = 0;
  std::vector<int64_t> recv_at(world, 0);
  for (int64_t r = 0; r < world; ++r) {
    recv_at[r] = total_recv;
    total_recv += recv_counts[r];
  }
  recv.resize(total_recv);
  RETURN_IF_ERROR(
      comm.AllToAllV(send.data(), send_counts, recv.data(), recv_counts, DType::kU8)
          .Annotate("redistribute " + ToString(t.layout()) + " -> " + ToString(target)));
  for (int64_t r = 0; r < world; ++r) {
    s.sent_bytes += send_counts[r];
    s.received_bytes += recv_counts[r];
  }

  // Unpack into this rank's destination shard, in the same order. The
  // result is described by the target layout as given; its bytes are the
  // same in the plan's (possibly finer) view.
  RETURN_IF_ERROR(out->Reset(target_mesh, target, me));
  if (mine != nullptr) {
    const std::vector<int64_t> dst_ext = mine->shard.extents();
    char* dst = out->local().data();
    for (const PieceCopy& c : mine->copies) {
      if (c.src_rank == me) {
        CopyBox(src, src_ext, c.src_box, dst, dst_ext, c.dst_box, es);
        continue;
      }
      const char* from = recv.data() + recv_at[c.src_rank];
      CopyBox(from, c.src_box.extents(), Box::FromShape(c.src_box.extents()), dst, dst_ext,
              c.dst_box, es);
      recv_at[c.src_rank] += NumElements(c.src_box) * es;
    }
  }
  if (stats != nullptr) *stats = s;
  return Status::Ok();
}

Result<DTensor> Redistribute(const DTensor& t, const Mesh& target_mesh, const Layout& target,
                             Communicator& comm, RedistributeStats* stats) {
  DTensor out;
  RETURN_IF_ERROR(RedistributeInto(t, target_mesh, target, comm, &out, stats));
  return out;
}

}  // namespace tessera
