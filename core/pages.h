// Memory pages given back to the system while the memory stays allocated:
// what parameter offload does with the weights of the units it holds on
// disk (runtime/train/offload.h). The addresses stay valid (kernels bound
// to them keep them), the whole pages inside the range are freed
// (madvise MADV_DONTNEED on private anonymous memory: the resident set
// shrinks at once) and read as zero until written again.
#ifndef TESSERA_CORE_PAGES_H_
#define TESSERA_CORE_PAGES_H_

#include <cstdint>

#include "core/status.h"

namespace tessera {

// Frees the whole pages inside [data, data + bytes); the partial pages at
// either end (shared with neighbouring data) are kept, so only bytes of
// the range change. `data` must be private anonymous memory (the heap).
Status ReturnPages(void* data, int64_t bytes);

// Asks for transparent huge pages (2 MiB) where whole ones fit inside the
// range (madvise MADV_HUGEPAGE): memory given back and filled again often
// faults in 512 times fewer pieces. A kernel without them is not an error.
Status PreferHugePages(void* data, int64_t bytes);

// The bytes ReturnPages would free of that range.
int64_t ReturnablePageBytes(const void* data, int64_t bytes);

}  // namespace tessera

#endif  // TESSERA_CORE_PAGES_H_
