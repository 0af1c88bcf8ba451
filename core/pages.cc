#include "core/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

// The whole pages of [data, data + bytes): [begin, end).
void WholePages(const void* data, int64_t bytes, uintptr_t* begin, uintptr_t* end) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(data);
  *begin = (a + page - 1) & ~(page - 1);
  *end = (a + static_cast<uintptr_t>(bytes > 0 ? bytes : 0)) & ~(page - 1);
}

}  // namespace

int64_t ReturnablePageBytes(const void* data, int64_t bytes) {
  uintptr_t begin = 0, end = 0;
  WholePages(data, bytes, &begin, &end);
  return end > begin ? static_cast<int64_t>(end - begin) : 0;
}

Status PreferHugePages(void* data, int64_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t a = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (a + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (a + static_cast<uintptr_t>(bytes > 0 ? bytes : 0)) & ~(kHuge - 1);
  if (end <= begin) return Status::Ok();
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0 &&
      errno != EINVAL) {
    return InternalError(std::string("cannot ask for huge pages: ") + std::strerror(errno));
  }
  return Status::Ok();
}

Status ReturnPages(void* data, int64_t bytes) {
  uintptr_t begin = 0, end = 0;
  WholePages(data, bytes, &begin, &end);
  if (end <= begin) return Status::Ok();
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) != 0) {
    return InternalError("cannot return " + std::to_string(end - begin) +
                         " bytes of memory to the system: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace tessera
