// SlicedCheckpointWriter: every rank of an in-process job writes its own
// pieces of one native checkpoint (replicas taking turns); the result reads
// back whole, and a rank that fails leaves nothing at the path.
#include "runtime/sliced_checkpoint.h"

#include <mutex>
#include <numeric>

#include <catch2/catch.hpp>

#include "runtime/async_checkpoint.h"
#include "runtime/comm/inprocess.h"

namespace tessera {
namespace {

Strategy ThreeTensors() {
  Mesh mesh = *Mesh::Parse("dp=2,tp=2");
  Strategy s(mesh);
  Layout a = Layout::Replicated({8, 4}, DType::kF32);  // split over tp: 2 replicas a piece
  a.dim_axes = {{"tp"}, {}};
  Layout b = Layout::Replicated({6}, DType::kF32);  // everywhere
  Layout c = Layout::Replicated({8}, DType::kF32);  // one piece per rank
  c.dim_axes = {{"dp", "tp"}};
  REQUIRE(s.Add({"a", a}).ok());
  REQUIRE(s.Add({"b", b}).ok());
  REQUIRE(s.Add({"c", c}).ok());
  return s;
}

std::vector<float> Values(int64_t n, float base) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), base);
  return v;
}

TEST_CASE("sliced checkpoint: every rank writes its pieces once, the whole reads back") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  std::vector<int> written(4, 0);
  std::mutex mu;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-1",
                                                                 strategy, {1, {{"k", "v"}}, "test"}));
    ASSIGN_OR_RETURN(std::vector<PieceToWrite> pieces, PiecesToWrite(strategy, world.rank()));
    for (const PieceToWrite& p : pieces) {
      const Layout& layout = strategy.tensors()[p.tensor].layout;
      std::vector<float> data(NumElements(p.box));
      CopyBox(full[p.tensor].data(), layout.shape, p.box, data.data(), p.box.extents(),
              Box::FromShape(p.box.extents()), sizeof(float));
      RETURN_IF_ERROR(writer->WritePiece(p.tensor, p.box, data.data()));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      written[world.rank()] = static_cast<int>(pieces.size());
    }
    return writer->Commit();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  // 7 pieces (2 of a, 1 of b, 4 of c) over 4 ranks: replicas take turns.
  CHECK(std::accumulate(written.begin(), written.end(), 0) == 7);
  CHECK(*std::max_element(written.begin(), written.end()) -
            *std::min_element(written.begin(), written.end()) <= 1);
  auto reader = OpenNativeCheckpoint(env.get(), "/ck/step-1");
  REQUIRE(reader.ok());
  CHECK((*reader)->meta().step == 1);
  CHECK((*reader)->meta().metadata.at("k") == "v");
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<float> got(full[i].size());
    REQUIRE(ReadTensor(**reader, i, got.data()).ok());
    CHECK(got == full[i]);
  }
}

TEST_CASE("sliced checkpoint: a rank that fails aborts the save everywhere") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  std::vector<Status> results(4);
  std::mutex mu;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-2",
                                                                 strategy, {2, {}, "test"}));
    ASSIGN_OR_RETURN(std::vector<PieceToWrite> pieces, PiecesToWrite(strategy, world.rank()));
    for (const PieceToWrite& p : pieces) {
      std::vector<float> data(NumElements(p.box), 1.0f);
      Box box = p.box;
      if (world.rank() == 2) box[0].end += 100;  // outside the tensor
      (void)writer->WritePiece(p.tensor, box, data.data());
    }
    const Status committed = writer->Commit();
    std::lock_guard<std::mutex> lock(mu);
    results[world.rank()] = committed;
    return Status::Ok();
  });
  REQUIRE(s.ok());
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].ToString());
    CHECK_FALSE(results[r].ok());
    if (r != 2) CHECK_THAT(results[r].message(), Catch::Contains("rank(s) 2 failed"));
  }
  CHECK_FALSE(env->FileExists("/ck/step-2"));
  auto children = env->GetChildren("/ck");
  REQUIRE(children.ok());
  CHECK(children->empty());  // the temporary is gone too
}

// Every rank's pieces of ThreeTensors, cut from `full`, into `store`
// (which must outlive their use).
std::vector<LocalPiece> Pieces(const Strategy& strategy, int64_t rank,
                               const std::vector<std::vector<float>>& full,
                               std::vector<std::vector<float>>* store) {
  std::vector<LocalPiece> out;
  const Result<std::vector<PieceToWrite>> pieces = PiecesToWrite(strategy, rank);
  if (!pieces.ok()) return out;  // (no REQUIRE on rank threads) the save then misses pieces
  for (const PieceToWrite& p : *pieces) {
    const Layout& layout = strategy.tensors()[p.tensor].layout;
    store->emplace_back(NumElements(p.box));
    CopyBox(full[p.tensor].data(), layout.shape, p.box, store->back().data(), p.box.extents(),
            Box::FromShape(p.box.extents()), sizeof(float));
    out.push_back({p.tensor, p.box, store->back().data(), NumElements(p.box) * 4});
  }
  return out;
}

TEST_CASE("async sliced save: snapshots, writes in the background, commits at a poll") {
  auto env = NewMemEnv();
  const Strategy strategy = ThreeTensors();
  std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    AsyncSlicedSave save(env.get(), world);
    std::vector<std::vector<float>> store;
    store.reserve(16);
    for (int step = 1; step <= 3; ++step) {
      auto pieces = Pieces(strategy, world.rank(), full, &store);
      RETURN_IF_ERROR(save.Start("/run", "step-" + std::to_string(step), strategy,
                                 {step, {}, "test"}, pieces, /*keep=*/2));
      // The snapshot was taken: changing the source now changes nothing saved.
      for (std::vector<float>& v : store) std::fill(v.begin(), v.end(), -1.0f);
      if (!save.in_flight()) return InternalError("no save in flight after Start");
    }
    ASSIGN_OR_RETURN(bool committed, save.Poll(/*wait=*/true));
    if (!committed || save.in_flight() || save.last().path != "/run/step-3") {
      return InternalError("the last save was not committed by Poll(wait)");
    }
    if (save.last().stall_seconds < 0 || save.last().background_seconds <= 0) {
      return InternalError("no timings");
    }
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto latest = ReadLatest(env.get(), "/run");
  REQUIRE(latest.ok());
  CHECK(*latest == "step-3");
  CHECK_FALSE(env->FileExists("/run/step-1"));  // --keep 2
  auto reader = OpenNativeCheckpoint(env.get(), "/run");
  REQUIRE(reader.ok());
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<float> got(full[i].size());
    REQUIRE(ReadTensor(**reader, i, got.data()).ok());
    CHECK(got == full[i]);
  }
}

TEST_CASE("async sliced save: a failed background write fails the commit on every rank") {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  const Strategy strategy = ThreeTensors();
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  std::vector<Status> results(4);
  std::mutex mu;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    AsyncSlicedSave save(&env, world);
    std::vector<std::vector<float>> store;
    store.reserve(16);
    RETURN_IF_ERROR(world.Barrier());
    if (world.rank() == 0) env.FailNthWrite(6, /*sticky=*/true);  // after the file headers
    RETURN_IF_ERROR(world.Barrier());
    RETURN_IF_ERROR(save.Start("/run", "step-1", strategy, {1, {}, "test"},
                               Pieces(strategy, world.rank(), full, &store)));
    const Result<bool> committed = save.Poll(/*wait=*/true);
    std::lock_guard<std::mutex> lock(mu);
    results[world.rank()] = committed.status();
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].ToString());
    CHECK_FALSE(results[r].ok());
  }
  CHECK_FALSE(env.FileExists("/run/step-1"));
  CHECK_FALSE(env.FileExists("/run/latest"));
}

}  // namespace
}  // namespace tessera
