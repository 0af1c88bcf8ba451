// SlicedCheckpointWriter: every rank of an in-process job writes its own
// pieces of one native checkpoint (replicas taking turns); the result reads
// back whole, and a rank that fails leaves nothing at the path.
#include "runtime/train/sliced_checkpoint.h"

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>

#include "ckpt/repair.h"
#include "ckpt/verify.h"
#include "runtime/comm/inprocess.h"
#include "runtime/train/async_checkpoint.h"

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

// Writes the writer's pieces of the tensors `full` holds.
Status WritePieces(SlicedCheckpointWriter& writer, const Strategy& strategy,
                   const std::vector<std::vector<float>>& full) {
  for (const PieceToWrite& p : writer.Pieces()) {
    const Layout& layout = strategy.tensors()[p.tensor].layout;
    std::vector<float> data(NumElements(p.box));
    CopyBox(full[p.tensor].data(), layout.shape, p.box, data.data(), p.box.extents(),
            Box::FromShape(p.box.extents()), sizeof(float));
    RETURN_IF_ERROR(writer.WritePiece(p.tensor, p.box, data.data()));
  }
  return Status::Ok();
}

// Reads every tensor of the checkpoint at `path`, checks it against `full`
// and returns the reader's recoveries.
std::vector<std::string> ReadAllBack(Env* env, const std::string& path,
                                     const std::vector<std::vector<float>>& full) {
  auto reader = OpenNativeCheckpoint(env, path);
  REQUIRE(reader.ok());
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<float> got(full[i].size());
    const Status s = ReadTensor(**reader, i, got.data());
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(got == full[i]);
  }
  return (*reader)->Recoveries();
}

// Runs `body` on 4 in-process ranks and returns what each rank set as its
// result (the outcome under test); an error `body` itself returns fails
// the test.
std::vector<Status> RankResults(const std::function<Status(Communicator&, Status*)>& body) {
  std::vector<Status> results(4);  // each rank sets only its own
  const Status s =
      RunInProcess(4, [&](Communicator& world) { return body(world, &results[world.rank()]); });
  INFO(s.ToString());
  REQUIRE(s.ok());
  return results;
}

TEST_CASE("sliced checkpoint: every rank writes its pieces once, the whole reads back") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  std::vector<int> written(4, 0);
  std::mutex mu;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto writer,
                     SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-1", strategy,
                                                    {1, {{"k", "v"}}, "test"}));
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
            *std::min_element(written.begin(), written.end()) <=
        1);
  auto reader = OpenNativeCheckpoint(env.get(), "/ck/step-1");
  REQUIRE(reader.ok());
  CHECK((*reader)->meta().step == 1);
  CHECK((*reader)->meta().metadata.at("k") == "v");
  CHECK(ReadAllBack(env.get(), "/ck/step-1", full).empty());
}

TEST_CASE(
    "merged checkpoint: every rank writes its pieces into one file, whole tensors on one rank") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  SlicedWriteOptions options;
  options.merged = true;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto writer,
                     SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-1", strategy,
                                                    {1, {}, "test"}, options));
    RETURN_IF_ERROR(WritePieces(*writer, strategy, full));
    return writer->Commit();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto children = env->GetChildren("/ck/step-1");
  REQUIRE(children.ok());
  CHECK(std::count_if(children->begin(), children->end(),
                      [](const std::string& n) { return n.ends_with(".tsr"); }) == 1);
  auto reader = OpenNativeCheckpoint(env.get(), "/ck/step-1");
  REQUIRE(reader.ok());
  CHECK((*reader)->strategy().mesh().world_size() == 1);
  for (const TensorStrategy& t : (*reader)->strategy().tensors()) {
    INFO(t.name);
    CHECK(t.layout.dim_axes.empty());
  }
  CHECK(ReadAllBack(env.get(), "/ck/step-1", full).empty());
  auto verified = VerifyNativeCheckpoint(env.get(), "/ck/step-1", {});
  REQUIRE(verified.ok());
  CHECK(verified->ok());
  CHECK(verified->pieces == 7);  // every rank's pieces, each once
}

TEST_CASE("merged checkpoint: redundancy or compression is refused, naming the path") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  for (int which = 0; which < 2; ++which) {
    SlicedWriteOptions options;
    options.merged = true;
    if (which == 0) options.redundancy = *Redundancy::Parse("replicas:2");
    if (which == 1) options.native.codec = Codec::kZstd;
    const std::vector<Status> results = RankResults([&](Communicator& world, Status* result) {
      *result = SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-4", strategy,
                                               {4, {}, "test"}, options)
                    .status();
      return Status::Ok();
    });
    for (const Status& r : results) {
      CHECK_THAT(r.message(), Catch::Contains("merged checkpoint '/ck/step-4'"));
      CHECK_THAT(r.message(), Catch::Contains(which == 0 ? "replicas:2 needs a sliced save"
                                                         : "cannot be compressed"));
    }
    CHECK_FALSE(env->FileExists("/ck/step-4"));
  }
}

TEST_CASE("sliced checkpoint: a rank that fails aborts the save everywhere") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const std::vector<Status> results =
      RankResults([&](Communicator& world, Status* result) -> Status {
        ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-2",
                                                                     strategy, {2, {}, "test"}));
        ASSIGN_OR_RETURN(std::vector<PieceToWrite> pieces, PiecesToWrite(strategy, world.rank()));
        for (const PieceToWrite& p : pieces) {
          std::vector<float> data(NumElements(p.box), 1.0f);
          Box box = p.box;
          if (world.rank() == 2) box[0].end += 100;  // outside the tensor
          (void)writer->WritePiece(p.tensor, box, data.data());
        }
        *result = writer->Commit();
        return Status::Ok();
      });
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

TEST_CASE("sliced checkpoint: a piece the plan gives another rank is refused") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const std::vector<Status> results = RankResults([&](Communicator& world,
                                                      Status* result) -> Status {
    ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env.get(), world, "/ck/step-3",
                                                                 strategy, {3, {}, "test"}));
    // Rank 1 writes rank 0's pieces instead of its own.
    ASSIGN_OR_RETURN(auto pieces, PiecesToWrite(strategy, world.rank() == 1 ? 0 : world.rank()));
    Status wrote;
    for (const PieceToWrite& p : pieces) {
      std::vector<float> data(NumElements(p.box), 1.0f);
      if (wrote.ok()) wrote = writer->WritePiece(p.tensor, p.box, data.data());
    }
    const Status committed = writer->Commit();
    *result = wrote.ok() ? committed : wrote;
    return Status::Ok();
  });
  CHECK_THAT(results[1].message(), Catch::Contains("is not one rank 1 writes"));
  for (int r : {0, 2, 3}) CHECK_THAT(results[r].message(), Catch::Contains("rank(s) 1 failed"));
  CHECK_FALSE(env->FileExists("/ck/step-3"));
}

TEST_CASE("save plan: replicas on different hosts, parity groups across hosts") {
  const Strategy strategy = ThreeTensors();
  const std::vector<int64_t> hosts = {7, 7, 9, 9};  // ranks 0,1 on one host, 2,3 on another
  auto plan = PlanSave(strategy, hosts, *Redundancy::Parse("replicas:2,parity:2"));
  REQUIRE(plan.ok());
  REQUIRE(plan->pieces.size() == 7);
  std::vector<int64_t> bytes(4, 0);
  for (const PlannedPiece& p : plan->pieces) {
    INFO("tensor " << p.tensor << " piece " << ToString(p.box));
    REQUIRE(p.writers.size() == 2);
    CHECK(hosts[p.writers[0]] != hosts[p.writers[1]]);
    // a's pieces have a holder on each host: both write from memory; c's
    // one holder needs a copy made by a rank on the other host.
    CHECK(p.from_memory == (p.tensor == 2 ? 1 : 2));
    for (int64_t w : p.writers) bytes[w] += p.bytes;
  }
  CHECK(*std::max_element(bytes.begin(), bytes.end()) <=
        2 * *std::min_element(bytes.begin(), bytes.end()));
  REQUIRE(plan->groups.size() == 2);
  for (const PlannedGroup& g : plan->groups) {
    REQUIRE(g.members.size() == 2);
    REQUIRE(g.writers.size() == 1);
    CHECK(hosts[g.members[0]] != hosts[g.members[1]]);
    CHECK(std::find(g.members.begin(), g.members.end(), g.writers[0]) == g.members.end());
  }
  CHECK(plan->needs_redundancy_phase());
  // Too many replicas, bad texts.
  CHECK_FALSE(PlanSave(strategy, hosts, *Redundancy::Parse("replicas:5")).ok());
  for (const char* bad : {"replicas", "replicas:0", "parity:1", "mirror:2", "replicas:2,"}) {
    INFO(bad);
    CHECK_FALSE(Redundancy::Parse(bad).ok());
  }
  CHECK(Redundancy::Parse("parity:4,replicas:3")->ToString() == "replicas:3,parity:4");
}

// Saves ThreeTensors from 4 in-process ranks with `redundancy` into
// `env`:/ck/step-1.
void SaveWithRedundancy(Env* env, const std::string& redundancy,
                        const std::vector<std::vector<float>>& full) {
  REQUIRE(env->CreateDirs("/ck").ok());
  const Strategy strategy = ThreeTensors();
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    SlicedWriteOptions options;
    ASSIGN_OR_RETURN(options.redundancy, Redundancy::Parse(redundancy));
    options.hosts = {"a", "a", "b", "b"};
    ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env, world, "/ck/step-1", strategy,
                                                                 {1, {}, "test"}, options));
    RETURN_IF_ERROR(WritePieces(*writer, strategy, full));
    return writer->Commit();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
}

void Corrupt(Env* env, const std::string& path, uint64_t at) {
  auto bytes = ReadFileToString(env, path);
  REQUIRE(bytes.ok());
  REQUIRE(at < bytes->size());
  (*bytes)[at] ^= 0x5a;
  auto out = env->NewWritableFile(path);
  REQUIRE(out.ok());
  REQUIRE((*out)->Append(bytes->data(), bytes->size()).ok());
  REQUIRE((*out)->Close().ok());
}

TEST_CASE("redundant sliced save: a lost or corrupt data file is read around and rebuilt") {
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  for (const char* redundancy : {"replicas:2", "parity:2", "parity:4", "replicas:2,parity:3"}) {
    for (bool remove : {true, false}) {
      INFO(redundancy << (remove ? ", data-00001.tsr deleted" : ", data-00001.tsr corrupt"));
      auto env = NewMemEnv();
      SaveWithRedundancy(env.get(), redundancy, full);
      auto manifest = ReadManifest(env.get(), "/ck/step-1");
      REQUIRE(manifest.ok());
      const bool parity = std::string(redundancy).find("parity") != std::string::npos;
      CHECK(manifest->parity_groups.empty() != parity);
      CHECK(ReadAllBack(env.get(), "/ck/step-1", full).empty());
      const std::string lost = "/ck/step-1/data-00001.tsr";
      const auto original = ReadFileToString(env.get(), lost);
      REQUIRE(original.ok());
      if (remove) {
        REQUIRE(env->DeleteFile(lost).ok());
      } else {
        // Inside a piece the reader reads (not a copy, which it would not).
        uint64_t at = 0;
        for (const TensorEntry& t : manifest->tensors) {
          for (const PieceInfo& p : t.pieces) {
            if (p.file == 1 && at == 0) at = p.offset + 3;
          }
        }
        REQUIRE(at > 0);
        Corrupt(env.get(), lost, at);
      }
      const std::vector<std::string> recovered = ReadAllBack(env.get(), "/ck/step-1", full);
      REQUIRE(recovered.size() == 1);
      CHECK_THAT(recovered[0], Catch::Contains("data-00001.tsr"));
      CHECK_THAT(
          recovered[0],
          Catch::Contains(parity && std::string(redundancy) != "replicas:2,parity:3" ? "parity"
                                                                                     : "cop"));
      auto repaired = RepairNativeCheckpoint(env.get(), "/ck/step-1", {});
      REQUIRE(repaired.ok());
      INFO((repaired->failed.empty() ? "" : repaired->failed[0]));
      CHECK(repaired->ok());
      REQUIRE(repaired->rebuilt.size() == 1);
      CHECK_THAT(repaired->rebuilt[0], Catch::StartsWith("data-00001.tsr: from"));
      const auto rebuilt = ReadFileToString(env.get(), lost);
      REQUIRE(rebuilt.ok());
      CHECK(*rebuilt == *original);  // bit for bit
      auto verified = VerifyNativeCheckpoint(env.get(), "/ck/step-1", {});
      REQUIRE(verified.ok());
      CHECK(verified->ok());
      CHECK(ReadAllBack(env.get(), "/ck/step-1", full).empty());
    }
  }
}

TEST_CASE("parity: a lost parity file is rebuilt, two lost files of a group are named") {
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  auto env = NewMemEnv();
  SaveWithRedundancy(env.get(), "parity:2", full);
  auto manifest = ReadManifest(env.get(), "/ck/step-1");
  REQUIRE(manifest.ok());
  REQUIRE(manifest->parity_groups.size() == 2);
  const ParityGroup& g = manifest->parity_groups[0];
  const std::string dir = "/ck/step-1/";
  const std::string parity = dir + manifest->files[g.parity].name;
  const auto original = ReadFileToString(env.get(), parity);
  REQUIRE(original.ok());
  REQUIRE(env->DeleteFile(parity).ok());
  auto repaired = RepairNativeCheckpoint(env.get(), "/ck/step-1", {});
  REQUIRE(repaired.ok());
  CHECK(repaired->ok());
  CHECK(*ReadFileToString(env.get(), parity) == *original);

  // Both members of one group: neither can be rebuilt, and both are named.
  const std::string a = manifest->files[g.members[0]].name, b = manifest->files[g.members[1]].name;
  REQUIRE(env->DeleteFile(dir + a).ok());
  REQUIRE(env->DeleteFile(dir + b).ok());
  repaired = RepairNativeCheckpoint(env.get(), "/ck/step-1", {});
  REQUIRE(repaired.ok());
  CHECK_FALSE(repaired->ok());
  REQUIRE(repaired->failed.size() == 2);
  CHECK_THAT(repaired->failed[0],
             Catch::StartsWith(a) && Catch::Contains(b) && Catch::Contains("one file per group"));
  auto reader = OpenNativeCheckpoint(env.get(), "/ck/step-1");
  REQUIRE(reader.ok());
  Status read = Status::Ok();
  for (size_t i = 0; i < full.size() && read.ok(); ++i) {
    std::vector<float> got(full[i].size());
    read = ReadTensor(**reader, i, got.data());
  }
  CHECK_FALSE(read.ok());
  CHECK_THAT(read.message(), Catch::Contains("is missing") && Catch::Contains("parity"));
}

TEST_CASE("rs:2+2 over two hosts: the manifest records the placement, a lost host loses nothing") {
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  for (const char* host : {"a", "b"}) {
    INFO("host " << host << "'s files deleted");
    auto env = NewMemEnv();
    SaveWithRedundancy(env.get(), "rs:2+2", full);  // ranks 0, 1 on a; 2, 3 on b
    auto manifest = ReadManifest(env.get(), "/ck/step-1");
    REQUIRE(manifest.ok());
    REQUIRE(manifest->erasure_groups.size() == 2);
    CHECK(manifest->parity_groups.empty());
    for (const ErasureGroup& g : manifest->erasure_groups) {
      CHECK(g.code == kRsCauchy);
      REQUIRE(g.members.size() == 2);
      REQUIRE(g.parity.size() == 2);
      std::map<std::string, int> per_host;
      for (uint32_t f : g.members) ++per_host[manifest->files[f].host];
      for (uint32_t f : g.parity) ++per_host[manifest->files[f].host];
      CHECK(per_host == std::map<std::string, int>{{"a", 2}, {"b", 2}});
    }
    for (int r = 0; r < 4; ++r) CHECK(manifest->files[r].host == (r < 2 ? "a" : "b"));
    CHECK(HostLossRisks(*manifest).empty());
    // The host goes: every file it wrote.
    std::map<std::string, std::string> originals;
    for (const FileInfo& f : manifest->files) {
      if (f.host != host) continue;
      originals[f.name] = *ReadFileToString(env.get(), "/ck/step-1/" + f.name);
      REQUIRE(env->DeleteFile("/ck/step-1/" + f.name).ok());
    }
    REQUIRE(originals.size() == 4);
    const std::vector<std::string> recovered = ReadAllBack(env.get(), "/ck/step-1", full);
    CHECK_FALSE(recovered.empty());
    for (const std::string& line : recovered) CHECK_THAT(line, Catch::Contains("rs:2+2 group"));
    auto repaired = RepairNativeCheckpoint(env.get(), "/ck/step-1", {});
    REQUIRE(repaired.ok());
    CHECK(repaired->ok());
    CHECK(repaired->rebuilt.size() == 4);
    for (const auto& [name, bytes] : originals) {
      INFO(name);
      CHECK(*ReadFileToString(env.get(), "/ck/step-1/" + name) == bytes);  // bit for bit
    }
    auto verified = VerifyNativeCheckpoint(env.get(), "/ck/step-1", {});
    REQUIRE(verified.ok());
    CHECK(verified->ok());
    CHECK(verified->host_loss_risks.empty());
  }
  // Three files of one group (M + 1): refused, naming them.
  auto env = NewMemEnv();
  SaveWithRedundancy(env.get(), "rs:2+2", full);
  auto manifest = ReadManifest(env.get(), "/ck/step-1");
  REQUIRE(manifest.ok());
  const ErasureGroup& g = manifest->erasure_groups[0];
  const std::vector<uint32_t> gone = {g.members[0], g.members[1], g.parity[0]};
  for (uint32_t f : gone) REQUIRE(env->DeleteFile("/ck/step-1/" + manifest->files[f].name).ok());
  auto repaired = RepairNativeCheckpoint(env.get(), "/ck/step-1", {});
  REQUIRE(repaired.ok());
  CHECK_FALSE(repaired->ok());
  REQUIRE(repaired->failed.size() == 3);
  for (uint32_t f : gone) CHECK_THAT(repaired->failed[0], Catch::Contains(manifest->files[f].name));
}

// Every rank's pieces of ThreeTensors, cut from `full`, into `store`
// (which must outlive their use).
std::vector<LocalPiece> Pieces(const Strategy& strategy, const std::vector<PieceToWrite>& pieces,
                               const std::vector<std::vector<float>>& full,
                               std::vector<std::vector<float>>* store) {
  std::vector<LocalPiece> out;
  for (const PieceToWrite& p : pieces) {
    const Layout& layout = strategy.tensors()[p.tensor].layout;
    store->emplace_back(NumElements(p.box));
    CopyBox(full[p.tensor].data(), layout.shape, p.box, store->back().data(), p.box.extents(),
            Box::FromShape(p.box.extents()), sizeof(float));
    out.push_back({p.tensor, p.box, store->back().data(), NumElements(p.box) * 4});
  }
  return out;
}

// An async save of ThreeTensors (`full`) with `options` (redundancy) on 4
// in-process ranks into /ck/step-1, polled without waiting until it
// commits: the redundancy phase must take a poll of its own. `described`:
// how the plan was described (SavePlan::Describe).
Status AsyncSaveWithRedundancy(Env* env, const std::vector<std::vector<float>>& full,
                               const SlicedWriteOptions& options, std::string* described) {
  const Strategy strategy = ThreeTensors();
  return RunInProcess(4, [&](Communicator& world) -> Status {
    AsyncSlicedSave save(env, world);
    std::vector<std::vector<float>> store;
    store.reserve(16);
    RETURN_IF_ERROR(
        save.Start("/ck", "step-1", strategy, {1, {}, "test"}, options,
                   [&](const std::vector<PieceToWrite>& mine) -> Result<std::vector<LocalPiece>> {
                     return Pieces(strategy, mine, full, &store);
                   }));
    int polls = 0;
    while (save.in_flight()) {
      ASSIGN_OR_RETURN(bool committed, save.Poll(/*wait=*/false));
      ++polls;
      if (committed) break;
      if (polls > 100000) return InternalError("never committed");
    }
    if (polls < 2) return InternalError("the redundancy phase took no poll of its own");
    if (world.rank() == 0) *described = save.last().redundancy;
    return Status::Ok();
  });
}

TEST_CASE("async sliced save with rs:2+2: the parity is encoded in the background") {
  auto env = NewMemEnv();
  std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  SlicedWriteOptions options;
  options.redundancy = *Redundancy::Parse("rs:2+2");
  options.hosts = {"n0", "n1", "n0", "n1"};
  std::string described;
  const Status s = AsyncSaveWithRedundancy(env.get(), full, options, &described);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK_THAT(described, Catch::StartsWith("rs:2+2: 2 groups"));
  auto manifest = ReadManifest(env.get(), "/ck/step-1");
  REQUIRE(manifest.ok());
  REQUIRE(manifest->erasure_groups.size() == 2);
  CHECK(HostLossRisks(*manifest).empty());
  for (const FileInfo& f : manifest->files) {
    if (f.host == "n1") REQUIRE(env->DeleteFile("/ck/step-1/" + f.name).ok());
  }
  CHECK_FALSE(ReadAllBack(env.get(), "/ck/step-1", full).empty());
}

TEST_CASE("async sliced save with parity and copies: the redundancy is written in the background") {
  auto env = NewMemEnv();
  std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  SlicedWriteOptions options;
  options.redundancy = {.replicas = 2, .parity_group = 2};
  std::string described;
  const Status s = AsyncSaveWithRedundancy(env.get(), full, options, &described);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto manifest = ReadManifest(env.get(), "/ck/step-1");
  REQUIRE(manifest.ok());
  CHECK(manifest->parity_groups.size() == 2);
  size_t copies = 0;
  for (const TensorEntry& t : manifest->tensors) copies += t.copies.size();
  CHECK(copies == 7);  // every piece once more
  REQUIRE(env->DeleteFile("/ck/step-1/data-00002.tsr").ok());
  const std::vector<std::string> recovered = ReadAllBack(env.get(), "/ck/step-1", full);
  CHECK_FALSE(recovered.empty());
  for (const std::string& line : recovered) CHECK_THAT(line, Catch::StartsWith("data-00002.tsr"));
}

TEST_CASE("async sliced save: snapshots, writes in the background, commits at a poll") {
  // With the snapshot arena prepared before the first save (train_gpt), or
  // made by the first save.
  const bool prepared = GENERATE(false, true);
  INFO((prepared ? "prepared" : "not prepared"));
  auto env = NewMemEnv();
  const Strategy strategy = ThreeTensors();
  std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    AsyncSlicedSave save(env.get(), world);
    std::vector<std::vector<float>> store;
    store.reserve(16);
    if (prepared) {
      ASSIGN_OR_RETURN(int64_t arena, save.Prepare(strategy, {}));
      ASSIGN_OR_RETURN(std::vector<PieceToWrite> mine, PiecesToWrite(strategy, world.rank()));
      int64_t need = 0;
      for (const PieceToWrite& p : mine) need += NumElements(p.box) * 4;
      if (need == 0 || arena < need) {
        return InternalError("an arena of " + std::to_string(arena) + " bytes for " +
                             std::to_string(need));
      }
    }
    for (int step = 1; step <= 3; ++step) {
      auto source = [&](const std::vector<PieceToWrite>& mine) -> Result<std::vector<LocalPiece>> {
        return Pieces(strategy, mine, full, &store);
      };
      RETURN_IF_ERROR(save.Start("/run", "step-" + std::to_string(step), strategy,
                                 {step, {}, "test"}, {}, source, /*keep=*/2));
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
  CHECK(ReadAllBack(env.get(), "/run", full).empty());
}

TEST_CASE("async sliced save: a failed background write fails the commit on every rank") {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  const Strategy strategy = ThreeTensors();
  const std::vector<std::vector<float>> full = {Values(32, 0), Values(6, 100), Values(8, 200)};
  const std::vector<Status> results =
      RankResults([&](Communicator& world, Status* result) -> Status {
        AsyncSlicedSave save(&env, world);
        std::vector<std::vector<float>> store;
        store.reserve(16);
        RETURN_IF_ERROR(world.Barrier());
        if (world.rank() == 0) env.FailNthWrite(6, /*sticky=*/true);  // after the file headers
        RETURN_IF_ERROR(world.Barrier());
        RETURN_IF_ERROR(save.Start(
            "/run", "step-1", strategy, {1, {}, "test"}, {},
            [&](const std::vector<PieceToWrite>& mine) -> Result<std::vector<LocalPiece>> {
              return Pieces(strategy, mine, full, &store);
            }));
        *result = save.Poll(/*wait=*/true).status();
        return Status::Ok();
      });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].ToString());
    CHECK_FALSE(results[r].ok());
  }
  CHECK_FALSE(env.FileExists("/run/step-1"));
  CHECK_FALSE(env.FileExists("/run/latest"));
}

}  // namespace
}  // namespace tessera
