// Asynchronous sliced saves: training stalls only while each rank copies
// its pieces into host memory; a background thread per rank then writes and
// checksums them into its data file, and the commit (gathering the piece
// records, the manifest, the rename, `latest`) happens on the training
// thread at the first step boundary where every rank's thread has finished.
// At most one save is in flight: starting another first waits for it.
//
// The snapshot goes into one host arena per rank, kept from save to save,
// on huge pages where the kernel gives them, its pages faulted in when it
// is made: Prepare makes it before the first save (at start-up), so that
// no save's stall pays for fresh memory.
//
// The collectives stay on the training thread (communicators are not
// shared with the writer threads): Poll costs one small all-reduce per step
// while a save is in flight and nothing otherwise.
#ifndef TESSERA_RUNTIME_TRAIN_ASYNC_CHECKPOINT_H_
#define TESSERA_RUNTIME_TRAIN_ASYNC_CHECKPOINT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/train/sliced_checkpoint.h"

namespace tessera {

struct AsyncSaveStats {
  std::string path;
  double stall_seconds = 0;       // Start on this rank: waiting for the last save + snapshot
  double background_seconds = 0;  // this rank's writer thread
  double commit_seconds = 0;      // the collective commit
  std::string redundancy;         // SavePlan::Describe of its plan
};

class AsyncSlicedSave {
 public:
  AsyncSlicedSave(Env* env, Communicator& world) : env_(env), world_(&world) {}
  ~AsyncSlicedSave();  // joins a thread still running (the save is not committed)

  bool in_flight() const { return writer_ != nullptr; }

  // Collective, optional, before the first Start: makes the snapshot arena
  // for the pieces this rank will write with `strategy` and `options`
  // (their plan); its pages are faulted in on a thread of its own while
  // training goes on (the first Start waits for it if it must). Returns
  // the arena's bytes on this rank.
  Result<int64_t> Prepare(const Strategy& strategy, const SlicedWriteOptions& options);
  // Local: waits until Prepare's arena is faulted in (benchmarks time it).
  void WaitPrepared() { arena_.Wait(); }

  // Where the bytes of this rank's pieces (of the writer's plan) are now.
  using PieceSource =
      std::function<Result<std::vector<LocalPiece>>(const std::vector<PieceToWrite>&)>;
  // Collective. Finishes a save still in flight (see Poll), creates the
  // writer of `root`/`name`, snapshots the pieces `source` points at
  // (copied now: the model may change right after) and starts writing them
  // in the background. After the commit, `latest` names it and, with
  // keep > 0, only the newest `keep` checkpoints stay. An empty `name`
  // saves to `root` itself and leaves `latest` alone.
  Status Start(const std::string& root, const std::string& name, const Strategy& strategy,
               CheckpointMeta meta, SlicedWriteOptions options, const PieceSource& source,
               int keep = 0);
  // Collective. Moves the save in flight on once every rank's thread is
  // done (with `wait`, waits for them): from the data files to the
  // redundancy phase (copies, parity; again in the background) when the
  // writer's plan has one, and then to the commit. Returns whether it
  // committed now; then last() describes it. An error of any rank's writing
  // fails every rank.
  Result<bool> Poll(bool wait);
  const AsyncSaveStats& last() const { return last_; }

 private:
  // Runs `work` on the writer thread; its error is kept in written_.
  void Launch(std::function<Status()> work);

  Env* env_;
  Communicator* world_;
  std::unique_ptr<SlicedCheckpointWriter> writer_;
  std::string root_, name_;
  int keep_ = 0;
  // The snapshot's memory: an anonymous mapping, kept and grown as needed.
  class Arena {
   public:
    ~Arena();
    // At least `bytes` of memory with its pages faulted in, kept. With
    // `background`, the faulting runs on a thread of its own and the
    // next Reserve waits for it.
    Result<char*> Reserve(size_t bytes, bool background = false);
    size_t size() const { return size_; }
    void Wait() {
      if (populating_.joinable()) populating_.join();
    }

   private:
    void Release();
    void* map_ = nullptr;
    size_t map_size_ = 0;
    char* base_ = nullptr;  // map_ aligned to a huge page
    size_t size_ = 0;
    std::thread populating_;
  };
  Arena arena_;
  std::vector<LocalPiece> pieces_;  // pointing into arena_
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool redundancy_started_ = false;
  Status written_;  // the thread's result, read after join
  AsyncSaveStats current_, last_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_ASYNC_CHECKPOINT_H_
