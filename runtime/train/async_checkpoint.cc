#include "runtime/train/async_checkpoint.h"

#include <chrono>
#include <cstring>
#include <functional>


namespace tessera {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AsyncSlicedSave::~AsyncSlicedSave() {
  if (thread_.joinable()) thread_.join();
}

Status AsyncSlicedSave::Start(const std::string& root, const std::string& name,
                              const Strategy& strategy, CheckpointMeta meta,
                              SlicedWriteOptions options, const PieceSource& source, int keep) {
  const auto t0 = std::chrono::steady_clock::now();
  if (in_flight()) RETURN_IF_ERROR(Poll(/*wait=*/true).status());
  const double waited = Since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(env_->CreateDirs(root));
  ASSIGN_OR_RETURN(writer_, SlicedCheckpointWriter::Create(env_, *world_, JoinPath(root, name),
                                                           strategy, std::move(meta),
                                                           std::move(options)));
  Result<std::vector<LocalPiece>> found = source(writer_->Pieces());
  if (!found.ok()) {
    writer_.reset();  // never started: every rank calls the same source
    return found.status();
  }
  const std::vector<LocalPiece>& pieces = *found;
  root_ = root;
  name_ = name;
  keep_ = keep;
  // The snapshot: the only part the training loop waits for. Buffers are
  // kept from save to save (same sizes every time: no new page faults).
  buffers_.resize(pieces.size());
  pieces_ = pieces;
  for (size_t i = 0; i < pieces.size(); ++i) {
    buffers_[i].resize(pieces[i].bytes);
    if (pieces[i].bytes > 0) std::memcpy(buffers_[i].data(), pieces[i].data, pieces[i].bytes);
    pieces_[i].data = buffers_[i].data();
  }
  current_ = {writer_->path(), waited + Since(t1), 0, 0, writer_->plan().Describe()};
  redundancy_started_ = false;
  Launch([this] {
    Status s;
    for (const LocalPiece& p : pieces_) {
      s = writer_->WritePiece(p.tensor, p.box, p.data);
      if (!s.ok()) break;
    }
    if (s.ok()) s = writer_->FinishData();
    return s;
  });
  return Status::Ok();
}

void AsyncSlicedSave::Launch(std::function<Status()> work) {
  done_ = false;
  thread_ = std::thread([this, work = std::move(work)] {
    const auto start = std::chrono::steady_clock::now();
    const Status s = work();
    if (written_.ok()) written_ = s;
    current_.background_seconds += Since(start);
    done_ = true;
  });
}

Result<bool> AsyncSlicedSave::Poll(bool wait) {
  if (!in_flight()) return false;
  while (true) {
    if (wait && thread_.joinable()) thread_.join();
    int all = done_ ? 1 : 0;
    RETURN_IF_ERROR(world_->AllReduce(&all, &all, 1, DType::kI32, ReduceOp::kMin));
    if (all == 0) return false;
    if (thread_.joinable()) thread_.join();
    if (redundancy_started_ || !writer_->plan().needs_redundancy_phase()) break;
    // Every data file is written: share the records (collective, here on
    // the training thread), then copies and parity in the background.
    redundancy_started_ = true;
    const auto t0 = std::chrono::steady_clock::now();
    (void)writer_->Exchange();  // a failure stays in the writer and fails the commit
    current_.commit_seconds += Since(t0);
    Launch([this] { return writer_->WriteRedundancy(); });
    if (!wait) return false;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // A rank whose writing failed has its writer fail the commit everywhere
  // (the writer remembers the first error).
  std::unique_ptr<SlicedCheckpointWriter> writer = std::move(writer_);
  const Status committed = writer->Commit();
  writer.reset();
  const Status written = written_;
  written_ = Status::Ok();
  RETURN_IF_ERROR(written);
  RETURN_IF_ERROR(committed);
  RETURN_IF_ERROR(PointLatest(env_, *world_, root_, name_, keep_));
  current_.commit_seconds += Since(t0);
  last_ = current_;
  return true;
}

}  // namespace tessera
