// Machine profiles (runtime/cost/machine_profile.h): parsing, errors that
// name the key, the collectives' line and measured tables, the kernels'
// measured figures and rooflines, and the shipped profiles.
#include "runtime/cost/machine_profile.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/runtime/cost/test_profiles.h"

namespace tessera {
namespace {

using testing::TestProfile;

// A minimal profile with `key` set to `value` (JSON), parsed as `source`.
Result<MachineProfile> ParseWith(const char* key, const std::string& value, const char* source) {
  return MachineProfile::Parse(std::string(R"({"format": "tessera.machine_profile", "version": 1,
    "device": {"matmul_flops": 1, "memory_bandwidth": 1}, "intra_host": {"bandwidth": 1}, ")") +
                                   key + "\": " + value + "}",
                               source);
}

TEST_CASE("machine profiles parse, round-trip and name what is wrong") {
  const MachineProfile p = TestProfile();
  CHECK(p.devices_per_host == 8);
  CHECK(p.inter_host.bandwidth == 1e10);
  auto again = MachineProfile::Parse(p.ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == p.ToJson());
  auto bad = MachineProfile::Parse(R"({"format": "tessera.machine_profile", "version": 1,
    "device": {"matmul_flops": 1e12, "memory_bandwidth": 0}, "intra_host": {"bandwidth": 1}})",
                                   "prof.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("prof.json") != std::string::npos);
  CHECK(bad.status().message().find("device.memory_bandwidth") != std::string::npos);
  auto other = MachineProfile::Parse(R"({"format": "tessera.op_strategy"})", "x.json");
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().message().find("not a machine profile") != std::string::npos);
  // A ring AllReduce: 2(n-1) latencies and 2(n-1)/n of the bytes.
  CHECK(p.CollectiveSeconds(CollectiveKind::kAllReduce, 8e9, 8, false) ==
        Approx(14 * 5e-6 + 2 * 7.0 / 8 * 8e9 / 1e11));
  CHECK(p.CollectiveSeconds(CollectiveKind::kAllReduce, 8e9, 1, false) == 0);
  CHECK_FALSE(p.CrossesHosts(1, 8));
  CHECK(p.CrossesHosts(8, 2));
  CHECK(p.CrossesHosts(1, 6));  // groups of 6 straddle hosts of 8
  CHECK_FALSE(p.CrossesHosts(2, 4));
}

TEST_CASE("the disk: measured figures price offload's reads and writes, shared on a host") {
  auto p = ParseWith("disk", R"({"read": 2e9, "write": 1e9})", "disk.json");
  REQUIRE(p.ok());
  CHECK(p->DiskSeconds(2e9, 1e9) == Approx(2.0));
  auto again = MachineProfile::Parse(p->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->disk_read == 2e9);
  CHECK(again->disk_write == 1e9);
  // Not measured: the default; four ranks on one host share its disk.
  MachineProfile q = TestProfile();
  q.hosts = 1;
  CHECK(q.DiskSeconds(MachineProfile::kDefaultDiskBandwidth, 0) == Approx(1.0));
  CHECK(q.ForRanks(4).DiskSeconds(MachineProfile::kDefaultDiskBandwidth, 0) == Approx(4.0));
  auto bad = ParseWith("disk", R"({"read": -1})", "neg.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("neg.json") != std::string::npos);
}

TEST_CASE("the matrix products' library and what each measured round-trip, bad names named") {
  const std::string device =
      R"({"matmul_flops": 1, "memory_bandwidth": 1, "matmul_library": "blis", )"
      R"("matmul_libraries": {"blis": 3e10, "openblas": 2e10}})";
  auto p = ParseWith("device", device, "lib.json");
  REQUIRE(p.ok());
  REQUIRE(p->matmul_library.has_value());
  CHECK(*p->matmul_library == MatmulLibrary::kBlis);
  REQUIRE(p->matmul_libraries.size() == 2);
  CHECK(p->matmul_libraries[1] == std::pair{MatmulLibrary::kOpenBlas, 2e10});
  auto again = MachineProfile::Parse(p->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == p->ToJson());
  CHECK_FALSE(TestProfile().matmul_library.has_value());  // none: the default, OpenBLAS
  for (const char* bad :
       {R"({"matmul_flops": 1, "memory_bandwidth": 1, "matmul_library": "mkl"})",
        R"({"matmul_flops": 1, "memory_bandwidth": 1, "matmul_library": 3})",
        R"({"matmul_flops": 1, "memory_bandwidth": 1, "matmul_libraries": {"mkl": 1}})",
        R"({"matmul_flops": 1, "memory_bandwidth": 1, "matmul_libraries": {"blis": -1}})"}) {
    auto q = ParseWith("device", bad, "bad.json");
    INFO(bad);
    REQUIRE_FALSE(q.ok());
    CHECK(q.status().message().find("bad.json: device.matmul_librar") != std::string::npos);
  }
}

TEST_CASE("measured collective tables price their kind and group, the line the rest") {
  MachineProfile p = TestProfile();
  auto with = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "devices_per_host": 8,
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "inter_host": {"latency_s": 1e-5, "bandwidth": 1e10},
    "collectives": [
      {"kind": "AllReduce", "group": 2, "bytes": [1000, 100000], "seconds": [1e-3, 4e-3]},
      {"kind": "AllGather", "group": 4, "bytes": [1000], "seconds": [2e-3]},
      {"kind": "ReduceScatter", "group": 8, "bytes": [1000], "seconds": [1e-9]},
      {"kind": "SendRecv", "group": 2, "bytes": [1000, 100000], "seconds": [1e-3, 2e-3]}]})",
                                    "<tables>");
  INFO(with.status().ToString());
  REQUIRE(with.ok());
  REQUIRE(with->collectives.size() == 4);
  auto again = MachineProfile::Parse(with->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == with->ToJson());
  const auto ar = CollectiveKind::kAllReduce;
  // Inside the table: log-log between its sizes; below it: its smallest.
  CHECK(with->CollectiveSeconds(ar, 1000, 2, false) == Approx(1e-3));
  CHECK(with->CollectiveSeconds(ar, 10000, 2, false) == Approx(2e-3));  // halfway, in logs
  CHECK(with->CollectiveSeconds(ar, 10, 2, false) == Approx(1e-3));
  // Beyond it: the largest's time and the line's bandwidth for the rest.
  CHECK(with->CollectiveSeconds(ar, 1e9, 2, false) == Approx(4e-3 + (1e9 - 1e5) / 1e11));
  // Never below the line (the back-to-back figure): a table faster than
  // the line's latencies gives way to it.
  const auto rs = CollectiveKind::kReduceScatter;
  CHECK(with->CollectiveSeconds(rs, 1e6, 8, false) ==
        Approx(p.CollectiveSeconds(rs, 1e6, 8, false)));
  CHECK(with->CollectiveSeconds(rs, 1e6, 8, false) == Approx(7 * 5e-6 + 7.0 / 8 * 1e6 / 1e11));
  // Another group size, another host, a kind without a table: the line.
  CHECK(with->CollectiveSeconds(ar, 1e5, 4, false) == p.CollectiveSeconds(ar, 1e5, 4, false));
  CHECK(with->CollectiveSeconds(ar, 1e5, 2, true) == p.CollectiveSeconds(ar, 1e5, 2, true));
  // A pipeline's transfer: its own table.
  CHECK(with->CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, false) ==
        Approx(std::sqrt(2) * 1e-3));
  CHECK(with->CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, true) ==
        p.CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, true));
  CHECK(with->CollectiveSeconds(CollectiveKind::kAllGather, 500, 4, false) == Approx(2e-3));
  CHECK(with->CollectiveSeconds(CollectiveKind::kReduceScatter, 5e6, 4, false) ==
        p.CollectiveSeconds(CollectiveKind::kReduceScatter, 5e6, 4, false));
  for (const char* bad :
       {R"([{"kind": "AllToAll", "group": 2, "bytes": [1], "seconds": [1]}])",
        R"([{"kind": "AllReduce", "group": 2, "bytes": [2, 1], "seconds": [1, 1]}])",
        R"([{"kind": "AllReduce", "group": 1, "bytes": [1], "seconds": [1]}])",
        R"([{"kind": "AllReduce", "group": 2, "bytes": [1], "seconds": [0]}])"}) {
    INFO(bad);
    auto r = ParseWith("collectives", bad, "m.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("m.json: collectives[0]") != std::string::npos);
  }
}

TEST_CASE("measured kernels price their units, the roofline the rest, and bad names are named") {
  const MachineProfile p = TestProfile();
  auto with = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "kernels": {"layer_norm_forward": 2e-9, "attention_forward_products": 1e-12}})",
                                    "<kernels>");
  INFO(with.status().ToString());
  REQUIRE(with.ok());
  auto again = MachineProfile::Parse(with->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == with->ToJson());
  CHECK(with->ToJson().find("\"layer_norm_forward\": 2e-09") != std::string::npos);
  CHECK(p.ToJson().find("kernels") == std::string::npos);  // none measured, none written
  CHECK(with->KernelSeconds(Kernel::kLayerNormForward, 1e6) == Approx(2e-3));
  CHECK(with->KernelSeconds(Kernel::kAttentionForwardProducts, 1e9) == Approx(1e-3));
  // Unmeasured: the roofline (a layer norm's backward reads x and dy and
  // writes dx; the attention's products run at the matrix-product rate).
  CHECK(with->KernelSeconds(Kernel::kLayerNormBackward, 1e6) == Approx(12e6 / 1e12));
  CHECK(with->KernelSeconds(Kernel::kAttentionBackwardProducts, 1e9) == Approx(1e9 / 1e14));
  CHECK(p.KernelSeconds(Kernel::kAdamW, 1e6) == Approx(28e6 / 1e12));
  // Ranks sharing a device share its throughput, measured or not.
  const MachineProfile shared = [&] {
    MachineProfile q = *with;
    q.hosts = 1;
    return q.ForRanks(2);
  }();
  CHECK(shared.KernelSeconds(Kernel::kLayerNormForward, 1e6) == Approx(4e-3));
  CHECK(shared.KernelSeconds(Kernel::kLayerNormBackward, 1e6) == Approx(2 * 12e6 / 1e12));
  for (auto [kernels, says] : std::vector<std::pair<const char*, const char*>>{
           {R"({"layer_norm_fwd": 1e-9})",
            "unknown kernel \"layer_norm_fwd\" (known: layer_norm_forward"},
           {R"({"adamw": 0})", "\"adamw\" must be a positive number"},
           {R"({"adamw": "fast"})", "\"adamw\" must be a positive number"},
           {R"([1])", "\"kernels\" must be an object"}}) {
    INFO(kernels);
    auto r = ParseWith("kernels", kernels, "k.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("k.json") != std::string::npos);
    CHECK(r.status().message().find(says) != std::string::npos);
  }
}

TEST_CASE("the shipped machine profiles load, each for its backend") {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/samples/gpt/profiles/";
  for (const auto& [file, backend] :
       std::vector<std::pair<std::string, std::string>>{{"debian-vm-2core.json", "inprocess"},
                                                        {"debian-vm-2core-mpi.json", "mpi"},
                                                        {"debian-vm-2core-gloo.json", "gloo"}}) {
    INFO(file);
    auto p = MachineProfile::Load(dir + file);
    REQUIRE(p.ok());
    CHECK(p->backend == backend);
    CHECK(p->devices_per_host == 2);
    CHECK(p->intra_host.latency_s > 0);
    CHECK(p->intra_host.bandwidth > 0);
    // Calibrated with the collectives' tables, every kind at 2 ranks.
    REQUIRE(p->collectives.size() == 4);
    for (const CollectiveTable& t : p->collectives) {
      CHECK(t.group == 2);
      CHECK(t.bytes.size() == 7);
      CHECK(std::is_sorted(t.seconds.begin(), t.seconds.end()));
    }
    // And every kernel measured.
    for (int k = 0; k < kKernelCount; ++k) {
      INFO(KernelName(static_cast<Kernel>(k)));
      CHECK(p->kernel_seconds[k] > 0);
    }
  }
}

}  // namespace
}  // namespace tessera
