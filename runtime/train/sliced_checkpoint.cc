#include "runtime/train/sliced_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <tuple>

#include "ckpt/output.h"
#include "core/checksum.h"
#include "formats/erasure.h"
#include "formats/parity.h"

namespace tessera {

std::string ThisHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
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

namespace {

std::string RankFileName(const char* kind, int64_t index) {
  char name[48];
  std::snprintf(name, sizeof(name), "%s-%05lld.tsr", kind, static_cast<long long>(index));
  return name;
}

// The XOR parity file of group g.
std::string ParityFileName(size_t g) { return RankFileName("parity", static_cast<int64_t>(g)); }

// A byte string gathered from every rank (lengths first; -1: the rank has
// nothing, it failed). Returns each rank's bytes, or nullopt for a failed one.
Result<std::vector<std::optional<std::string>>> AllGatherStrings(Communicator& comm,
                                                                 const std::string* mine) {
  const int size = comm.size();
  int64_t length = mine != nullptr ? static_cast<int64_t>(mine->size()) : -1;
  std::vector<int64_t> lengths(size);
  RETURN_IF_ERROR(comm.AllGather(&length, 1, lengths.data(), DType::kI64));
  std::vector<int64_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[r] = std::max<int64_t>(0, lengths[r]);
  std::string all(total, '\0');
  static const char kNothing = 0;  // a rank with nothing still sends from a valid pointer
  RETURN_IF_ERROR(comm.AllGatherV(mine != nullptr ? mine->data() : &kNothing, counts[comm.rank()],
                                  all.data(), counts, DType::kU8));
  std::vector<std::optional<std::string>> out(size);
  int64_t at = 0;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] >= 0) out[r] = all.substr(at, counts[r]);
    at += counts[r];
  }
  return out;
}

std::string FailedRanks(const std::vector<std::optional<std::string>>& parts) {
  std::string failed;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  return failed;
}

}  // namespace

Result<std::vector<std::string>> GatherHostNames(Communicator& comm) {
  const std::string mine = ThisHostName();
  ASSIGN_OR_RETURN(auto names, AllGatherStrings(comm, &mine));
  std::vector<std::string> out;
  for (auto& n : names) out.push_back(n.value_or(""));
  return out;
}

Result<std::unique_ptr<SlicedCheckpointWriter>> SlicedCheckpointWriter::Create(
    Env* env, Communicator& comm, const std::string& path, Strategy strategy, CheckpointMeta meta,
    SlicedWriteOptions options) {
  std::unique_ptr<SlicedCheckpointWriter> w(new SlicedCheckpointWriter);
  w->env_ = env;
  w->comm_ = &comm;
  w->path_ = path;
  w->meta_ = std::move(meta);
  w->pieces_.resize(strategy.tensors().size());
  w->copies_.resize(strategy.tensors().size());
  w->strategy_ = std::move(strategy);
  if (w->strategy_.mesh().world_size() != comm.size()) {
    return InvalidArgumentError("sliced checkpoint '" + path + "': the strategy's mesh " +
                                w->strategy_.mesh().ToString() + " is not the " +
                                std::to_string(comm.size()) + " ranks writing it");
  }
  if (options.hosts.empty()) {
    ASSIGN_OR_RETURN(options.hosts, GatherHostNames(comm));
  }
  if (static_cast<int>(options.hosts.size()) != comm.size()) {
    return InvalidArgumentError("sliced checkpoint '" + path +
                                "': " + std::to_string(options.hosts.size()) + " host names for " +
                                std::to_string(comm.size()) + " ranks");
  }
  if (options.merged && !options.redundancy.none()) {
    return InvalidArgumentError("merged checkpoint '" + path + "': redundancy " +
                                options.redundancy.ToString() +
                                " needs a sliced save (a merged one is one data file)");
  }
  if (options.merged && options.native.codec != Codec::kRaw) {
    return InvalidArgumentError("merged checkpoint '" + path +
                                "': its pieces are placed before they are written, so they "
                                "cannot be compressed; compress with a sliced save");
  }
  Result<SavePlan> plan = PlanSave(w->strategy_, HostIds(options.hosts), options.redundancy);
  if (!plan.ok()) return plan.status().Annotate("sliced checkpoint '" + path + "'");
  w->plan_ = std::move(*plan);
  uint64_t placed_size = 0;
  if (options.merged) {
    // Every rank places every piece alike: rank 0's pieces first, then rank
    // 1's, ..., so that each rank writes one region of the file front to
    // back (as it would its own file) instead of pieces interleaved with
    // the others'.
    const std::vector<PlannedPiece>& planned = w->plan_.pieces;
    std::vector<size_t> order(planned.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return planned[a].writers[0] < planned[b].writers[0];
    });
    std::vector<uint64_t> bytes;
    for (size_t i : order) bytes.push_back(static_cast<uint64_t>(planned[i].bytes));
    std::vector<uint64_t> offsets;
    std::tie(offsets, placed_size) = PlacedDataFile::Place(bytes);
    w->offsets_.resize(planned.size());
    for (size_t k = 0; k < order.size(); ++k) w->offsets_[order[k]] = offsets[k];
  }
  for (size_t i = 0; i < w->plan_.pieces.size(); ++i) {
    const PlannedPiece& p = w->plan_.pieces[i];
    w->plan_index_[{p.tensor, p.box.origin()}] = i;
  }
  w->options_ = std::move(options);
  const NativeWriteOptions& native = w->options_.native;
  // Rank 0 names and creates the temporary; everyone learns its name (or
  // that it failed).
  Status prepared;
  std::string tmp;
  if (comm.rank() == 0) {
    Result<OutputPaths> out = PrepareOutput(env, path, native.overwrite, /*directory=*/true);
    prepared = out.status();
    if (out.ok()) tmp = out->tmp;
    if (prepared.ok() && w->options_.merged) {  // the one data file, before the others open it
      Result<std::unique_ptr<PlacedDataFile>> file =
          PlacedDataFile::Create(env, JoinPath(tmp, RankFileName("data", 0)), 0, placed_size);
      prepared = file.status();
      if (file.ok()) {
        w->placed_ = std::move(*file);
      } else {
        RemoveOutput(env, {path, tmp});
      }
    }
  }
  // The temporary's name, or (negative length) why rank 0 failed.
  std::string message = prepared.ok() ? tmp : prepared.message();
  int64_t length = static_cast<int64_t>(message.size());
  if (!prepared.ok()) length = -length - 1;
  RETURN_IF_ERROR(comm.Broadcast(&length, 1, DType::kI64, 0));
  message.resize(static_cast<size_t>(length < 0 ? -length - 1 : length));
  RETURN_IF_ERROR(
      comm.Broadcast(message.data(), static_cast<int64_t>(message.size()), DType::kU8, 0));
  if (length < 0) {
    if (!prepared.ok()) return prepared;
    return AbortedError("sliced checkpoint '" + path +
                        "': rank 0 could not prepare it: " + message);
  }
  tmp = message;
  w->tmp_ = tmp;
  w->file_name_ = RankFileName("data", w->options_.merged ? 0 : comm.rank());
  // A rank that cannot open its file reports it at Commit, so that every
  // rank reaches the same collectives.
  auto keep = [&](auto file, auto* into) {
    if (file.ok()) {
      *into = std::move(*file);
    } else {
      w->failed_ = file.status();
    }
  };
  const std::string data_path = JoinPath(tmp, w->file_name_);
  if (w->options_.merged) {
    w->data_size_ = placed_size;
    if (comm.rank() != 0) keep(PlacedDataFile::Open(env, data_path, 0), &w->placed_);
  } else {
    keep(DataFileWriter::Create(env, data_path, 0), &w->file_);
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
  return Store(index, box, data, nullptr);
}

Status SlicedCheckpointWriter::WritePieceFrom(size_t index, const Box& box,
                                              const PieceReader& read) {
  return Store(index, box, nullptr, &read);
}

Status SlicedCheckpointWriter::Store(size_t index, const Box& box, const void* data,
                                     const PieceReader* read) {
  RETURN_IF_ERROR(failed_);
  Status s = [&]() -> Status {
    if (data_finished_) return FailedPreconditionError("its data file is finished");
    ASSIGN_OR_RETURN(const TensorStrategy* t,
                     CheckWritePiece(strategy_, "checkpoint", path_, index, box));
    // This rank must be one of the piece's writers from memory; the first
    // stores the piece, the others copies.
    const auto it = plan_index_.find({index, box.origin()});
    const int rank = comm_->rank();
    int64_t slot = -1;
    if (it != plan_index_.end() && plan_.pieces[it->second].box == box) {
      const PlannedPiece& planned = plan_.pieces[it->second];
      for (int64_t k = 0; k < planned.from_memory && slot < 0; ++k) {
        if (planned.writers[k] == rank) slot = k;
      }
    }
    if (slot < 0) {
      return InvalidArgumentError("tensor '" + t->name + "' piece " + ToString(box) +
                                  " is not one rank " + std::to_string(rank) + " writes");
    }
    const size_t size = static_cast<size_t>(NumElements(box) * DTypeSize(t->layout.dtype));
    std::vector<char> whole;  // a streamed piece to encode
    if (read != nullptr && !placed_ && options_.native.codec != Codec::kRaw) {
      whole.resize(size);
      RETURN_IF_ERROR((*read)(0, size, whole.data()));
      data = whole.data();
      read = nullptr;
    }
    if (placed_) {
      ASSIGN_OR_RETURN(PieceInfo info,
                       read != nullptr
                           ? placed_->WriteRawFrom(offsets_[it->second], *read, size, box)
                           : placed_->WriteRaw(offsets_[it->second], data, size, box));
      pieces_[index].push_back(std::move(info));
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(PieceInfo info,
                     read != nullptr ? file_->AppendFrom(*read, size, box, t->layout.dtype)
                                     : file_->Append(data, size, box, t->layout.dtype,
                                                     options_.native.codec, options_.native.level));
    (slot == 0 ? pieces_ : copies_)[index].push_back(std::move(info));
    return Status::Ok();
  }();
  if (!s.ok()) failed_ = s.Annotate("sliced checkpoint '" + path_ + "'");
  Hook("write");
  return failed_;
}

Status SlicedCheckpointWriter::FinishData() {
  if (data_finished_) return failed_;
  data_finished_ = true;
  if (!failed_.ok()) return failed_;
  if (placed_) return SyncData();  // its size was planned; no whole-file checksum (many writers)
  failed_ = file_->EndPieces();
  if (!failed_.ok()) return failed_;
  data_size_ = file_->size();
  data_checksum_ = file_->checksum();
  // With a redundancy phase to come, the data file is made durable after
  // it (SyncData): the copies and parity are read from the page cache
  // while the disk writes the data files back, instead of after.
  if (!plan_.needs_redundancy_phase()) return SyncData();
  return failed_;
}

Status SlicedCheckpointWriter::SyncData() {
  if (data_synced_ || !failed_.ok()) return failed_;
  data_synced_ = true;
  if (placed_) {
    failed_ = placed_->Finish();
    return failed_;
  }
  Result<uint64_t> bytes = file_->Finish();
  if (!bytes.ok()) {
    failed_ = bytes.status();
  } else if (*bytes != data_size_) {
    failed_ = InternalError("data file '" + file_->path() + "' grew after it was finished");
  }
  return failed_;
}

std::string SlicedCheckpointWriter::Part() const {
  Manifest m;
  m.mesh = strategy_.mesh();
  m.files.push_back({file_name_, data_size_, data_checksum_});
  for (const FileInfo& f : extra_files_) m.files.push_back(f);
  // Copies go in as the pieces of a second list of the tensors (a part
  // holds copies of pieces that are in other ranks' parts).
  const size_t n = strategy_.tensors().size();
  for (size_t k = 0; k < 2 * n; ++k) {
    const TensorStrategy& t = strategy_.tensors()[k % n];
    m.tensors.push_back({k < n ? t.name : "copies of " + t.name,
                         t.layout,
                         t.mesh,
                         k < n ? pieces_[k] : copies_[k - n],
                         {}});
  }
  return SerializeManifest(m);
}

Status SlicedCheckpointWriter::Exchange() {
  if (exchanged_done_) return failed_;
  exchanged_done_ = true;
  (void)FinishData();  // a failure is in failed_; this rank still joins the all-gather
  const std::string part = failed_.ok() ? Part() : std::string();
  Result<std::vector<std::optional<std::string>>> gathered =
      AllGatherStrings(*comm_, failed_.ok() ? &part : nullptr);
  if (!gathered.ok() && failed_.ok()) failed_ = gathered.status();
  if (!failed_.ok()) return failed_;
  const auto& parts = *gathered;
  const std::string failed = FailedRanks(parts);
  if (!failed.empty()) {
    failed_ = AbortedError("checkpoint '" + path_ + "': rank(s) " + failed +
                           " failed to write their pieces");
    return failed_;
  }
  for (size_t r = 0; r < parts.size(); ++r) {
    Result<Manifest> m =
        ParseManifest(*parts[r], JoinPath(tmp_, "rank " + std::to_string(r) + "'s records"));
    if (!m.ok()) {
      failed_ = m.status();
      return failed_;
    }
    exchanged_.push_back(std::move(*m));
  }
  return Status::Ok();
}

Status SlicedCheckpointWriter::WriteRedundancy() {
  if (redundancy_done_) return failed_;
  redundancy_done_ = true;
  RETURN_IF_ERROR(failed_);
  if (!exchanged_done_ || exchanged_.size() != static_cast<size_t>(comm_->size())) {
    failed_ =
        FailedPreconditionError("checkpoint '" + path_ + "': WriteRedundancy before Exchange");
    return failed_;
  }
  Hook("redundancy");
  const int rank = comm_->rank();
  failed_ = [&]() -> Status {
    // Copies of pieces this rank does not hold: the stored bytes from the
    // first writer's data file, checked against their checksum.
    std::unique_ptr<DataFileWriter> copies;
    std::map<int64_t, std::unique_ptr<RandomAccessFile>> sources;
    std::string buffer;
    for (const PlannedPiece& p : plan_.pieces) {
      if (std::find(p.writers.begin() + p.from_memory, p.writers.end(), rank) == p.writers.end()) {
        continue;
      }
      const int64_t from = p.writers[0];
      const Manifest& src = exchanged_[from];
      const std::vector<PieceInfo>& recs = src.tensors[p.tensor].pieces;
      const auto rec = std::find_if(recs.begin(), recs.end(),
                                    [&](const PieceInfo& q) { return q.box == p.box; });
      const std::string src_path = JoinPath(tmp_, src.files[0].name);
      const std::string ctx = "copy of tensor '" + strategy_.tensors()[p.tensor].name + "' piece " +
                              ToString(p.box) + " from '" + src_path + "'";
      if (rec == recs.end())
        return InternalError(ctx + ": rank " + std::to_string(from) + " has no record of it");
      auto& file = sources[from];
      if (!file) {
        ASSIGN_OR_RETURN(file, env_->NewRandomAccessFile(src_path));
      }
      buffer.resize(rec->length);
      RETURN_IF_ERROR(file->Read(rec->offset, rec->length, buffer.data()).Annotate(ctx));
      if (Xxh3(buffer.data(), buffer.size()) != rec->checksum) {
        return DataLossError(ctx + ": checksum mismatch");
      }
      if (!copies) {
        const std::string name = RankFileName("copies", rank);
        ASSIGN_OR_RETURN(copies, DataFileWriter::Create(env_, JoinPath(tmp_, name), 1));
        extra_files_.push_back({name, 0});
      }
      StoredPiece stored;
      stored.data = buffer.data();
      stored.size = buffer.size();
      stored.info = *rec;
      ASSIGN_OR_RETURN(PieceInfo info, copies->Append(stored));
      copies_[p.tensor].push_back(std::move(info));
    }
    if (copies) {
      ASSIGN_OR_RETURN(extra_files_.back().size, copies->Finish());
      extra_files_.back().checksum = copies->checksum();
    }
    // Parity files of the groups this rank writes: XOR, or its rows of the
    // Reed-Solomon code.
    for (size_t g = 0; g < plan_.groups.size(); ++g) {
      const PlannedGroup& group = plan_.groups[g];
      std::vector<int> rows;
      for (size_t j = 0; j < group.writers.size(); ++j) {
        if (group.writers[j] == rank) rows.push_back(static_cast<int>(j));
      }
      if (rows.empty()) continue;
      std::vector<ParityMember> members;
      for (int64_t m : group.members) {
        members.push_back(
            {JoinPath(tmp_, exchanged_[m].files[0].name), exchanged_[m].files[0].size});
      }
      Result<std::vector<FileInfo>> written = WriteGroupParity(
          env_, tmp_, plan_.redundancy, static_cast<int64_t>(g), members, rows, ParityFileName(g));
      if (!written.ok()) return written.status().Annotate("checkpoint '" + path_ + "'");
      for (FileInfo& f : *written) extra_files_.push_back(std::move(f));
    }
    return Status::Ok();
  }();
  return SyncData();
}

Status SlicedCheckpointWriter::Commit() {
  if (done_) return FailedPreconditionError("checkpoint '" + path_ + "' was already committed");
  const int rank = comm_->rank(), size = comm_->size();
  (void)FinishData();  // failures stay in failed_ and fail the commit below
  if (plan_.needs_redundancy_phase()) {
    // Failures land in failed_ and fail the commit below on every rank.
    (void)Exchange();
    (void)WriteRedundancy();
  }
  (void)SyncData();
  Hook("commit");
  // This rank's part of the manifest: its files and its records, gathered
  // on rank 0 (every rank learns who failed).
  const std::string part = failed_.ok() ? Part() : std::string();
  ASSIGN_OR_RETURN(auto parts, AllGatherStrings(*comm_, failed_.ok() ? &part : nullptr));
  const std::string failed_ranks = FailedRanks(parts);
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
        m.tensors.push_back({t.name, t.layout, t.mesh, {}, {}});
      }
      if (options_.merged) {
        // Whole tensors on one rank: nothing split, every stage's. The
        // pieces stay boxes of the split shape, so a view stays.
        m.mesh = *Mesh::Create({"r"}, {1});
        for (TensorEntry& t : m.tensors) {
          Layout whole = Layout::Replicated(t.layout.shape, t.layout.dtype);
          whole.view = t.layout.view;
          t.layout = std::move(whole);
          t.mesh.reset();
        }
      }
      // Files: every rank's data file (index = rank), then the copies and
      // parity files in rank order.
      std::vector<Manifest> ps;
      for (int r = 0; r < size; ++r) {
        const std::string where = JoinPath(tmp_, "rank " + std::to_string(r) + "'s records");
        ASSIGN_OR_RETURN(Manifest p, ParseManifest(*parts[r], where));
        if (p.files.empty() || p.tensors.size() != 2 * m.tensors.size()) {
          return InternalError(where + ": not this checkpoint's");
        }
        if (r == 0 || !options_.merged) {  // merged: every rank's pieces are in rank 0's file
          m.files.push_back(p.files[0]);
          m.files.back().host = options_.hosts[r];
        }
        ps.push_back(std::move(p));
      }
      std::map<std::string, uint32_t> index;
      for (int r = 0; r < size; ++r) {
        std::vector<uint32_t> renumber = {static_cast<uint32_t>(options_.merged ? 0 : r)};
        for (size_t f = 1; f < ps[r].files.size(); ++f) {
          renumber.push_back(static_cast<uint32_t>(m.files.size()));
          index[ps[r].files[f].name] = renumber.back();
          m.files.push_back(ps[r].files[f]);
          m.files.back().host = options_.hosts[r];
        }
        const size_t n = m.tensors.size();
        for (size_t k = 0; k < 2 * n; ++k) {
          TensorEntry& t = m.tensors[k % n];
          for (PieceInfo& piece : ps[r].tensors[k].pieces) {
            piece.file = renumber.at(piece.file);
            (k < n ? t.pieces : t.copies).push_back(std::move(piece));
          }
        }
      }
      for (size_t g = 0; g < plan_.groups.size(); ++g) {
        const PlannedGroup& group = plan_.groups[g];
        std::vector<uint32_t> members, parity;
        for (int64_t r : group.members) members.push_back(static_cast<uint32_t>(r));
        for (size_t j = 0; j < group.writers.size(); ++j) {
          const std::string name =
              plan_.redundancy.erasure.k > 0
                  ? ErasureFileName(static_cast<int64_t>(g), static_cast<int>(j))
                  : ParityFileName(g);
          const auto it = index.find(name);
          if (it == index.end()) {
            return InternalError("checkpoint '" + path_ + "': " + name + " was not written");
          }
          parity.push_back(it->second);
        }
        if (plan_.redundancy.erasure.k > 0) {
          m.erasure_groups.push_back({kRsCauchy, std::move(members), std::move(parity)});
        } else {
          m.parity_groups.push_back({std::move(members), parity[0]});
        }
      }
      auto by_origin = [](const PieceInfo& a, const PieceInfo& b) {
        return OriginLess(a.box, b.box);
      };
      for (TensorEntry& t : m.tensors) {
        int64_t covered = 0;
        for (const PieceInfo& p : t.pieces) covered += NumElements(p.box);
        if (covered != NumElements(t.layout)) {
          return InternalError("checkpoint '" + path_ + "': tensor '" + t.name +
                               "': the ranks' pieces cover " + std::to_string(covered) + " of " +
                               std::to_string(NumElements(t.layout)) + " elements");
        }
        std::sort(t.pieces.begin(), t.pieces.end(), by_origin);
        std::stable_sort(t.copies.begin(), t.copies.end(), by_origin);
      }
      RETURN_IF_ERROR(CommitManifest(env_, tmp_, m));
      Hook("rename");
      RETURN_IF_ERROR(CommitOutput(env_, {path_, tmp_}, options_.native.overwrite));
      Hook("committed");  // in place, `latest` not yet pointed at it
      return Status::Ok();
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
