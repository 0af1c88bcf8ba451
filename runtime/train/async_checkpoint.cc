#include "runtime/train/async_checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>

#include "core/byte_size.h"
#include "core/trace.h"

namespace tessera {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;  // each piece's start in the arena

}  // namespace

AsyncSlicedSave::Arena::~Arena() { Release(); }

void AsyncSlicedSave::Arena::Release() {
  Wait();
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  base_ = nullptr;
  size_ = 0;
}

namespace {

// Faults in every page of [base, base + size) for writing.
void Populate(char* base, size_t size) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(base, size, MADV_POPULATE_WRITE) == 0) return;
#endif
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t at = 0; at < size; at += page) static_cast<volatile char*>(base)[at] = 0;
}

}  // namespace

Result<char*> AsyncSlicedSave::Arena::Reserve(size_t bytes, bool background) {
  Wait();
  if (bytes <= size_ && base_ != nullptr) return base_;
  Release();
  const size_t size = RoundUp(std::max<size_t>(bytes, 1), kHugePage);
  const size_t length = size + kHugePage;  // room to align the start
  void* map = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    return ResourceExhaustedError(
        "async save: no " + std::to_string(size) +
        " bytes of host memory for the snapshot: " + std::strerror(errno));
  }
  map_ = map;
  map_size_ = length;
  base_ = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(map), kHugePage));
  size_ = size;
  // Huge pages where the kernel gives them (a hint): 512 times fewer
  // faults, and fewer TLB misses in every snapshot copy (0.11 against 0.14
  // s/GiB here). Finding them may take the kernel a while (compaction):
  // one more reason to fault the arena in before the first save.
  (void)::madvise(base_, size_, MADV_HUGEPAGE);
  if (background) {
    populating_ = std::thread(Populate, base_, size_);
  } else {
    Populate(base_, size_);
  }
  return base_;
}

Result<int64_t> AsyncSlicedSave::Prepare(const Strategy& strategy,
                                         const SlicedWriteOptions& options) {
  std::vector<std::string> hosts = options.hosts;
  if (hosts.empty()) {
    ASSIGN_OR_RETURN(hosts, GatherHostNames(*world_));
  }
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(strategy, HostIds(hosts), options.redundancy));
  size_t bytes = 0;
  for (const PieceToWrite& p : PiecesToWrite(plan, world_->rank())) {
    bytes += RoundUp(static_cast<size_t>(NumElements(p.box) *
                                         DTypeSize(strategy.tensors()[p.tensor].layout.dtype)),
                     kAlign);
  }
  ASSIGN_OR_RETURN(char* base, arena_.Reserve(bytes, /*background=*/true));
  (void)base;
  return static_cast<int64_t>(arena_.size());
}

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
  if (!name.empty()) RETURN_IF_ERROR(env_->CreateDirs(root));
  const std::string path = name.empty() ? root : JoinPath(root, name);
  ASSIGN_OR_RETURN(writer_, SlicedCheckpointWriter::Create(env_, *world_, path, strategy,
                                                           std::move(meta), std::move(options)));
  Result<std::vector<LocalPiece>> found = source(writer_->Pieces());
  if (!found.ok()) {
    writer_.reset();  // never started: every rank calls the same source
    return found.status();
  }
  const std::vector<LocalPiece>& pieces = *found;
  root_ = root;
  name_ = name;
  keep_ = keep;
  // The snapshot: the only part the training loop waits for, into the
  // kept arena (Prepare made it; else the first save does).
  size_t bytes = 0;
  for (const LocalPiece& p : pieces) bytes += RoundUp(static_cast<size_t>(p.bytes), kAlign);
  Result<char*> base = arena_.Reserve(bytes);
  if (!base.ok()) {
    writer_.reset();
    return base.status();
  }
  pieces_ = pieces;
  size_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    char* dst = *base + at;
    if (pieces[i].bytes > 0) std::memcpy(dst, pieces[i].data, static_cast<size_t>(pieces[i].bytes));
    pieces_[i].data = dst;
    at += RoundUp(static_cast<size_t>(pieces[i].bytes), kAlign);
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
  thread_ = std::thread([this, work = std::move(work), trace = Trace::Current()] {
    ScopedTrace scoped(trace);  // the rank's timeline, on the writer thread
    const auto start = std::chrono::steady_clock::now();
    Status s;
    {
      TraceSpan span("checkpoint", "async write");
      s = work();
    }
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
  if (!name_.empty()) RETURN_IF_ERROR(PointLatest(env_, *world_, root_, name_, keep_));
  current_.commit_seconds += Since(t0);
  last_ = current_;
  return true;
}

}  // namespace tessera
