#include "runtime/sliced_checkpoint.h"

#include <algorithm>
#include <cstdio>

#include "ckpt/output.h"

namespace tessera {

Result<std::vector<PieceToWrite>> PiecesToWrite(const Strategy& strategy, int64_t rank) {
  std::vector<PieceToWrite> out;
  int64_t turn = 0;  // over the whole strategy: small replicated tensors spread too
  for (size_t i = 0; i < strategy.tensors().size(); ++i) {
    const TensorStrategy& t = strategy.tensors()[i];
    const Mesh& mesh = t.mesh.has_value() ? *t.mesh : strategy.mesh();
    ASSIGN_OR_RETURN(std::vector<ReplicaGroup> groups, ReplicaGroups(t.layout, mesh));
    for (const ReplicaGroup& g : groups) {
      if (IsEmpty(g.box) || g.ranks.empty()) continue;
      const int64_t writer = g.ranks[turn++ % static_cast<int64_t>(g.ranks.size())];
      if (writer == rank) out.push_back({i, g.box});
    }
  }
  return out;
}

Status PointLatest(Env* env, Communicator& comm, const std::string& root, const std::string& name,
                   int keep) {
  Status latest;
  if (comm.rank() == 0) {
    latest = SetLatest(env, root, name);
    if (latest.ok() && keep > 0) latest = PruneCheckpoints(env, root, keep);
  }
  int ok = latest.ok() ? 1 : 0;
  RETURN_IF_ERROR(comm.Broadcast(&ok, 1, DType::kI32, 0));
  RETURN_IF_ERROR(latest);
  if (ok == 0) return AbortedError("rank 0 could not point '" + root + "/latest' at " + name);
  return Status::Ok();
}

Result<std::unique_ptr<SlicedCheckpointWriter>> SlicedCheckpointWriter::Create(
    Env* env, Communicator& comm, const std::string& path, Strategy strategy, CheckpointMeta meta,
    const NativeWriteOptions& options) {
  std::unique_ptr<SlicedCheckpointWriter> w(new SlicedCheckpointWriter);
  w->env_ = env;
  w->comm_ = &comm;
  w->path_ = path;
  w->meta_ = std::move(meta);
  w->options_ = options;
  w->pieces_.resize(strategy.tensors().size());
  w->strategy_ = std::move(strategy);
  if (w->strategy_.mesh().world_size() != comm.size()) {
    return InvalidArgumentError("sliced checkpoint '" + path + "': the strategy's mesh " +
                                w->strategy_.mesh().ToString() + " is not the " +
                                std::to_string(comm.size()) + " ranks writing it");
  }
  // Rank 0 names and creates the temporary; everyone learns its name (or
  // that it failed).
  Status prepared;
  std::string tmp;
  if (comm.rank() == 0) {
    Result<OutputPaths> out = PrepareOutput(env, path, options.overwrite, /*directory=*/true);
    prepared = out.status();
    if (out.ok()) tmp = out->tmp;
  }
  int64_t length = prepared.ok() ? static_cast<int64_t>(tmp.size()) : -1;
  RETURN_IF_ERROR(comm.Broadcast(&length, 1, DType::kI64, 0));
  if (length < 0) {
    if (!prepared.ok()) return prepared;
    return AbortedError("sliced checkpoint '" + path + "': rank 0 could not prepare it");
  }
  tmp.resize(length);
  RETURN_IF_ERROR(comm.Broadcast(tmp.data(), length, DType::kU8, 0));
  w->tmp_ = tmp;
  char name[32];
  std::snprintf(name, sizeof(name), "data-%05d.tsr", comm.rank());
  w->file_name_ = name;
  // A rank that cannot open its file reports it at Commit, so that every
  // rank reaches the same collectives.
  Result<std::unique_ptr<DataFileWriter>> file =
      DataFileWriter::Create(env, JoinPath(tmp, name), static_cast<uint32_t>(comm.rank()));
  if (file.ok()) {
    w->file_ = std::move(*file);
  } else {
    w->failed_ = file.status();
  }
  return w;
}

SlicedCheckpointWriter::~SlicedCheckpointWriter() {
  // Rank 0 owns the temporary; an uncommitted one is removed there (the
  // other ranks' files are inside it).
  if (!done_ && comm_ != nullptr && comm_->rank() == 0 && !tmp_.empty()) {
    RemoveOutput(env_, {path_, tmp_});
  }
}

Status SlicedCheckpointWriter::WritePiece(size_t index, const Box& box, const void* data) {
  RETURN_IF_ERROR(failed_);
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(const TensorStrategy* t,
                     CheckWritePiece(strategy_, "checkpoint '" + path_ + "'", index, box));
    const size_t size = static_cast<size_t>(NumElements(box) * DTypeSize(t->layout.dtype));
    ASSIGN_OR_RETURN(PieceInfo info, file_->Append(data, size, box, t->layout.dtype,
                                                   options_.codec, options_.level));
    pieces_[index].push_back(std::move(info));
    return Status::Ok();
  }();
  if (!s.ok()) failed_ = s;
  return s;
}

Status SlicedCheckpointWriter::Commit() {
  if (done_) return FailedPreconditionError("checkpoint '" + path_ + "' was already committed");
  const int rank = comm_->rank(), size = comm_->size();
  // This rank's part of the manifest: its file and its pieces.
  std::string part;
  if (failed_.ok()) {
    Result<uint64_t> bytes = file_->Finish();
    if (bytes.ok()) {
      Manifest m;
      m.mesh = strategy_.mesh();
      m.files.push_back({file_name_, *bytes});
      for (size_t i = 0; i < strategy_.tensors().size(); ++i) {
        const TensorStrategy& t = strategy_.tensors()[i];
        TensorEntry e{t.name, t.layout, t.mesh, pieces_[i]};
        for (PieceInfo& p : e.pieces) p.file = 0;
        m.tensors.push_back(std::move(e));
      }
      part = SerializeManifest(m);
    } else {
      failed_ = bytes.status();
    }
  }
  // Sizes first (-1: this rank failed), then the parts, on rank 0.
  int64_t mine = failed_.ok() ? static_cast<int64_t>(part.size()) : -1;
  std::vector<int64_t> lengths(size);
  RETURN_IF_ERROR(comm_->AllGather(&mine, 1, lengths.data(), DType::kI64));
  std::string failed_ranks;
  std::vector<int64_t> counts(size);
  for (int r = 0; r < size; ++r) {
    if (lengths[r] < 0) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
    counts[r] = std::max<int64_t>(0, lengths[r]);
  }
  std::string all;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (rank == 0) all.resize(total);
  RETURN_IF_ERROR(comm_->GatherV(part.data(), counts[rank], all.data(), counts, DType::kU8, 0));
  Status committed;
  if (!failed_ranks.empty()) {
    committed = AbortedError("checkpoint '" + path_ + "': rank(s) " + failed_ranks +
                             " failed to write their pieces");
  } else if (rank == 0) {
    committed = [&]() -> Status {
      Manifest m;
      m.step = meta_.step;
      m.metadata = meta_.metadata;
      m.created_by = meta_.created_by;
      m.mesh = strategy_.mesh();
      for (const TensorStrategy& t : strategy_.tensors()) {
        m.tensors.push_back({t.name, t.layout, t.mesh, {}});
      }
      int64_t at = 0;
      for (int r = 0; r < size; ++r) {
        const std::string where = JoinPath(tmp_, "rank " + std::to_string(r) + "'s records");
        ASSIGN_OR_RETURN(Manifest p, ParseManifest(std::string_view(all).substr(at, counts[r]),
                                                   where));
        at += counts[r];
        if (p.files.size() != 1 || p.tensors.size() != m.tensors.size()) {
          return InternalError(where + ": not this checkpoint's");
        }
        m.files.push_back(p.files[0]);
        for (size_t i = 0; i < p.tensors.size(); ++i) {
          for (PieceInfo& piece : p.tensors[i].pieces) {
            piece.file = static_cast<uint32_t>(r);
            m.tensors[i].pieces.push_back(std::move(piece));
          }
        }
      }
      for (TensorEntry& t : m.tensors) {
        int64_t covered = 0;
        for (const PieceInfo& p : t.pieces) covered += NumElements(p.box);
        if (covered != NumElements(t.layout)) {
          return InternalError("checkpoint '" + path_ + "': tensor '" + t.name +
                               "': the ranks' pieces cover " + std::to_string(covered) + " of " +
                               std::to_string(NumElements(t.layout)) + " elements");
        }
        std::sort(t.pieces.begin(), t.pieces.end(), [](const PieceInfo& a, const PieceInfo& b) {
          return a.box.origin() < b.box.origin();
        });
      }
      RETURN_IF_ERROR(CommitManifest(env_, tmp_, m));
      return CommitOutput(env_, {path_, tmp_}, options_.overwrite);
    }();
  }
  int ok = committed.ok() ? 1 : 0;
  RETURN_IF_ERROR(comm_->Broadcast(&ok, 1, DType::kI32, 0));
  done_ = ok == 1;
  if (!failed_.ok()) return failed_;
  if (!committed.ok()) return committed;
  if (ok == 0) return AbortedError("checkpoint '" + path_ + "': rank 0 could not commit it");
  return Status::Ok();
}

}  // namespace tessera
