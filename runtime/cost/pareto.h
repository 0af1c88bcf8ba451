// Pareto fronts: of a set of options, those no other is at least as good
// as in every criterion. The search keeps such fronts of heads, of block
// halves and of blocks, each under its own criteria.
#ifndef TESSERA_RUNTIME_COST_PARETO_H_
#define TESSERA_RUNTIME_COST_PARETO_H_

#include <utility>
#include <vector>

namespace tessera {

// Adds `item` to `front` unless a member dominates it, and drops the
// members it dominates. `dominates(a, b)`: a is at least as good as b in
// every criterion (so, of two equal items, the first stays). The front
// keeps its members' order.
template <typename T, typename Dominates>
void KeepUndominated(std::vector<T>* front, T item, const Dominates& dominates) {
  for (const T& k : *front) {
    if (dominates(k, item)) return;
  }
  std::erase_if(*front, [&](const T& k) { return dominates(item, k); });
  front->push_back(std::move(item));
}

// The items that no other dominates, in their order.
template <typename T, typename Dominates>
std::vector<T> ParetoFront(std::vector<T> items, const Dominates& dominates) {
  std::vector<T> front;
  for (T& item : items) KeepUndominated(&front, std::move(item), dominates);
  return front;
}

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_PARETO_H_
