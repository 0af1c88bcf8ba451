// Small string predicates the layers share.
#ifndef TESSERA_CORE_STRINGS_H_
#define TESSERA_CORE_STRINGS_H_

#include <string_view>

namespace tessera {

inline bool StartsWith(std::string_view s, std::string_view head) {
  return s.size() >= head.size() && s.substr(0, head.size()) == head;
}

inline bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace tessera

#endif  // TESSERA_CORE_STRINGS_H_
