// Machine profiles the cost-model and search tests price on: a GPU-like
// test machine and the shipped DGX A100 profile.
#ifndef TESSERA_TESTS_RUNTIME_COST_TEST_PROFILES_H_
#define TESSERA_TESTS_RUNTIME_COST_TEST_PROFILES_H_

#include <catch2/catch.hpp>
#include <string>

#include "runtime/cost/machine_profile.h"

namespace tessera::testing {

// A machine for tests: 8 devices a host, figures of the order of a GPU's.
inline MachineProfile TestProfile() {
  auto p = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "devices_per_host": 8,
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12, "memory_bytes": 8e10},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "inter_host": {"latency_s": 1e-5, "bandwidth": 1e10}})",
                                 "<test>");
  REQUIRE(p.ok());
  return *p;
}

// The shipped DGX A100 profile (samples/gpt/profiles/dgx-a100-80gb.json).
inline const MachineProfile& Dgx() {
  static const MachineProfile p = [] {
    auto r = MachineProfile::Load(std::string(TESSERA_SOURCE_DIR) +
                                  "/samples/gpt/profiles/dgx-a100-80gb.json");
    REQUIRE(r.ok());
    return *r;
  }();
  return p;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_RUNTIME_COST_TEST_PROFILES_H_
