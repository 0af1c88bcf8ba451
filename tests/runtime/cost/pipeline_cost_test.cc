// The step's pricing (runtime/cost/pipeline_cost.h): stage balancing.
// How the pipeline's simulation prices ranks that share devices is tested
// through the GPT's predictions (tests/runtime/model/gpt_predict_test.cc).
#include "runtime/cost/pipeline_cost.h"

#include <algorithm>
#include <catch2/catch.hpp>

namespace tessera {
namespace {

TEST_CASE("pipeline stages are balanced by cost: the last stage's head takes layers away") {
  CHECK(BalanceStages(8, 2, 1.0, 0.0, 0.0) == std::vector<int>{4, 4});
  // The head costs 1.3 blocks: the last stage gets fewer layers.
  CHECK(BalanceStages(8, 2, 1.0, 0.1, 1.3) == std::vector<int>{5, 3});
  // Three blocks and the head (2) on the last stage would be 5: it gets one.
  const std::vector<int> four = BalanceStages(12, 4, 1.0, 0.0, 2.0);
  CHECK(four.back() == 1);
  CHECK(*std::max_element(four.begin(), four.end()) == 4);
  const std::vector<int> s = BalanceStages(96, 8, 1.0, 0.2, 1.3);
  int sum = 0;
  for (int n : s) {
    sum += n;
    CHECK(n >= 1);
  }
  CHECK(sum == 96);
  CHECK(s.back() < s.front());
}

}  // namespace
}  // namespace tessera
