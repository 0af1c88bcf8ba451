// A communicator that records every call of another on the calling
// thread's trace (core/trace.h): collectives in category "comm" from issue
// to completion, named by kind with their bytes and the communicator's
// name ("AllReduce tp"); point-to-point sends and receives in "pipeline",
// a non-blocking one from issue to the end of its Wait, the Wait itself
// as "wait". Split communicators are traced too. The wrapped communicator
// does the work; results are the same.
#ifndef TESSERA_RUNTIME_COMM_TRACED_H_
#define TESSERA_RUNTIME_COMM_TRACED_H_

#include <memory>

#include "runtime/comm/communicator.h"

namespace tessera {

// Traces `inner` (not owned; it must outlive the result).
std::unique_ptr<Communicator> TracedCommunicator(Communicator& inner);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_TRACED_H_
