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

Result<RedistributionPlan> RedistributionPlan::Create(const Mesh& mesh, const Layout& from,
                                                      const Mesh& target_mesh, const Layout& target,
                                                      int64_t rank) {
  RedistributionPlan p;
  p.rank_ = rank;
  p.es_ = DTypeSize(target.dtype);
  p.what_ = "redistribute " + ToString(from) + " -> " + ToString(target);
  ASSIGN_OR_RETURN(std::optional<Box> src_shard, ShardOf(from, mesh, rank));
  ASSIGN_OR_RETURN(std::optional<Box> dst_shard, ShardOf(target, target_mesh, rank));
  p.src_bytes_ = src_shard ? NumElements(*src_shard) * DTypeSize(from.dtype) : 0;
  p.dst_bytes_ = dst_shard ? NumElements(*dst_shard) * p.es_ : 0;
  const int64_t world = mesh.world_size();
  // FSDP's unshard (row blocks in rank order -> replicated) is one
  // AllGatherV straight into the result: no packing.
  ASSIGN_OR_RETURN(auto blocks, RowBlocksInRankOrder(mesh, from, target_mesh, target));
  if (blocks && target.shape == from.shape && target.dtype == from.dtype) {
    p.gather_counts_ = std::move(*blocks);
    return p;
  }
  // Every rank plans the same (deterministic) copies; local pieces first.
  std::vector<int64_t> load;
  ASSIGN_OR_RETURN(TensorPlan plan, PlanTensorReshard("tensor", mesh, from, target_mesh, target,
                                                      {.prefer_local = true}, &load));
  // The source shard in the plan's coordinates (the same bytes whatever the
  // view: only its extents may differ).
  ASSIGN_OR_RETURN(std::optional<Box> src_box, ShardOf(plan.src_layout, mesh, rank));
  if (src_box) p.src_ext_ = src_box->extents();
  p.send_counts_.assign(world, 0);
  p.recv_counts_.assign(world, 0);
  for (const ShardPlan& sp : plan.shards) {
    if (sp.dst_rank == rank) p.dst_ext_ = sp.shard.extents();
    for (const PieceCopy& c : sp.copies) {
      const Piece piece{sp.dst_rank == rank ? c.src_rank : sp.dst_rank, c.src_box, c.dst_box,
                        NumElements(c.src_box) * p.es_};
      if (sp.dst_rank == rank) {
        p.receives_.push_back(piece);
        if (c.src_rank != rank) p.recv_counts_[c.src_rank] += piece.bytes;
      } else if (c.src_rank == rank) {
        p.sends_.push_back(piece);
        p.send_counts_[sp.dst_rank] += piece.bytes;
      }
    }
  }
  return p;
}

Status RedistributionPlan::Run(const void* src_bytes, void* dst_bytes, Communicator& comm,
                               std::vector<char>* send, std::vector<char>* recv,
                               RedistributeStats* stats) const {
  const int64_t world = comm.size();
  const char* src = static_cast<const char*>(src_bytes);
  char* dst = static_cast<char*>(dst_bytes);
  if (!gather_counts_.empty()) {
    RETURN_IF_ERROR(comm.AllGatherV(src, gather_counts_[rank_], dst, gather_counts_, DType::kU8)
                        .Annotate(what_));
    if (stats != nullptr) {
      const int64_t mine = gather_counts_[rank_];
      *stats = {mine * (world - 1), dst_bytes_ - mine, mine};
    }
    return Status::Ok();
  }
  // Pack what others need from here, in plan order.
  send->clear();
  for (const Piece& c : sends_) {
    const size_t at = send->size();
    send->resize(at + c.bytes);
    CopyBox(src, src_ext_, c.src_box, send->data() + at, c.src_box.extents(),
            Box::FromShape(c.src_box.extents()), es_);
  }
  int64_t total_recv = 0;
  std::vector<int64_t> recv_at(world, 0);
  for (int64_t r = 0; r < world; ++r) {
    recv_at[r] = total_recv;
    total_recv += recv_counts_[r];
  }
  recv->resize(total_recv);
  RETURN_IF_ERROR(comm.AllToAllV(send->data(), send_counts_, recv->data(), recv_counts_, DType::kU8)
                      .Annotate(what_));
  // Unpack into this rank's target shard, in the same order.
  RedistributeStats s;
  for (int64_t r = 0; r < world; ++r) {
    s.sent_bytes += send_counts_[r];
    s.received_bytes += recv_counts_[r];
  }
  for (const Piece& c : receives_) {
    if (c.peer == rank_) {
      CopyBox(src, src_ext_, c.src_box, dst, dst_ext_, c.dst_box, es_);
      s.local_bytes += c.bytes;
      continue;
    }
    const char* from = recv->data() + recv_at[c.peer];
    CopyBox(from, c.src_box.extents(), Box::FromShape(c.src_box.extents()), dst, dst_ext_,
            c.dst_box, es_);
    recv_at[c.peer] += c.bytes;
  }
  if (stats != nullptr) *stats = s;
  return Status::Ok();
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
  ASSIGN_OR_RETURN(
      const RedistributionPlan plan,
      RedistributionPlan::Create(t.mesh(), t.layout(), target_mesh, target, comm.rank()));
  RETURN_IF_ERROR(out->Reset(target_mesh, target, comm.rank()));
  thread_local std::vector<char> send, recv;  // kept between calls (see the header)
  return plan.Run(t.local().data(), out->local().data(), comm, &send, &recv, stats);
}

Result<DTensor> Redistribute(const DTensor& t, const Mesh& target_mesh, const Layout& target,
                             Communicator& comm, RedistributeStats* stats) {
  DTensor out;
  RETURN_IF_ERROR(RedistributeInto(t, target_mesh, target, comm, &out, stats));
  return out;
}

}  // namespace tessera
