#include "python/src/object_comm.h"

#include <cstring>

#include "runtime/comm/reduce.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

Status FromPython(const char* what, py::error_already_set& e) {
  return AbortedError(std::string("comm.") + what + "() raised " + e.what());
}

Status NoPointToPoint() {
  return UnimplementedError(
      "the Python comm adapter offers collectives only (save_shards and load_shards need no "
      "point-to-point messages)");
}

}  // namespace

ObjectCommunicator::ObjectCommunicator(py::object comm, int rank, int size)
    : comm_(std::move(comm)), rank_(rank), size_(size) {
  set_name("python comm");
}

ObjectCommunicator::~ObjectCommunicator() {
  py::gil_scoped_acquire gil;
  comm_ = py::object();
}

Result<std::unique_ptr<ObjectCommunicator>> ObjectCommunicator::Create(py::object comm, int rank) {
  for (const char* method : {"barrier", "allgather_object"}) {
    if (!py::hasattr(comm, method)) {
      return InvalidArgumentError(std::string("comm has no ") + method +
                                  "() (give an object with barrier() and allgather_object(), "
                                  "e.g. tessera.torch.TorchComm())");
    }
  }
  py::list ranks;
  try {
    ranks = comm.attr("allgather_object")(rank);
  } catch (py::error_already_set& e) {
    return FromPython("allgather_object", e);
  } catch (py::cast_error&) {
    return InvalidArgumentError("comm.allgather_object() did not return a list");
  }
  const int size = static_cast<int>(ranks.size());
  for (int i = 0; i < size; ++i) {
    int r = -1;
    try {
      r = ranks[i].cast<int>();
    } catch (py::cast_error&) {
    }
    if (r != i) {
      return InvalidArgumentError("comm: the process at position " + std::to_string(i) +
                                  " of allgather_object() passed rank " +
                                  py::str(ranks[i]).cast<std::string>() +
                                  " (each process's rank must be its position in the comm)");
    }
  }
  return std::unique_ptr<ObjectCommunicator>(new ObjectCommunicator(std::move(comm), rank, size));
}

Result<std::vector<std::string>> ObjectCommunicator::Exchange(const void* mine, size_t bytes) {
  py::gil_scoped_acquire gil;
  py::list all;
  try {
    all = comm_.attr("allgather_object")(py::bytes(static_cast<const char*>(mine), bytes));
  } catch (py::error_already_set& e) {
    return FromPython("allgather_object", e);
  } catch (py::cast_error&) {
    return AbortedError("comm.allgather_object() did not return a list");
  }
  if (static_cast<int>(all.size()) != size_) {
    return AbortedError("comm.allgather_object() returned " + std::to_string(all.size()) +
                        " items for " + std::to_string(size_) + " ranks");
  }
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) {
    if (!py::isinstance<py::bytes>(all[r])) {
      return AbortedError("comm.allgather_object() returned a " +
                          py::str(py::type::of(all[r])).cast<std::string>() + " for rank " +
                          std::to_string(r) + ", not the bytes it was given");
    }
    out[r] = all[r].cast<std::string>();
  }
  return out;
}

Status ObjectCommunicator::Barrier() {
  py::gil_scoped_acquire gil;
  try {
    comm_.attr("barrier")();
  } catch (py::error_already_set& e) {
    return FromPython("barrier", e);
  }
  return Status::Ok();
}

Status ObjectCommunicator::Broadcast(void* buf, int64_t count, DType dtype, int root) {
  const size_t bytes = static_cast<size_t>(count * DTypeSize(dtype));
  ASSIGN_OR_RETURN(auto all, Exchange(buf, rank_ == root ? bytes : 0));
  if (all[root].size() != bytes) {
    return InvalidArgumentError("broadcast: rank " + std::to_string(root) + " sent " +
                                std::to_string(all[root].size()) + " bytes, rank " +
                                std::to_string(rank_) + " expected " + std::to_string(bytes));
  }
  if (rank_ != root && bytes > 0) std::memcpy(buf, all[root].data(), bytes);
  return Status::Ok();
}

Status ObjectCommunicator::AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                     ReduceOp op) {
  RETURN_IF_ERROR(CheckReduction(dtype, op));
  const size_t bytes = static_cast<size_t>(count * DTypeSize(dtype));
  ASSIGN_OR_RETURN(auto all, Exchange(send, bytes));
  std::vector<const void*> inputs;
  for (int r = 0; r < size_; ++r) {
    if (all[r].size() != bytes) {
      return InvalidArgumentError("all-reduce: rank " + std::to_string(r) + " sent " +
                                  std::to_string(all[r].size()) + " bytes, rank " +
                                  std::to_string(rank_) + " " + std::to_string(bytes));
    }
    inputs.push_back(all[r].data());
  }
  ReduceRankOrder(dtype, op, inputs, recv, count);
  return Status::Ok();
}

Status ObjectCommunicator::AllGatherV(const void* send, int64_t count, void* recv,
                                      std::span<const int64_t> counts, DType dtype) {
  if (static_cast<int>(counts.size()) != size_) {
    return InvalidArgumentError("all-gather: " + std::to_string(counts.size()) + " counts for " +
                                std::to_string(size_) + " ranks");
  }
  const int64_t es = DTypeSize(dtype);
  ASSIGN_OR_RETURN(auto all, Exchange(send, static_cast<size_t>(count * es)));
  char* at = static_cast<char*>(recv);
  for (int r = 0; r < size_; ++r) {
    if (static_cast<int64_t>(all[r].size()) != counts[r] * es) {
      return InvalidArgumentError("all-gather: rank " + std::to_string(r) + " sent " +
                                  std::to_string(all[r].size()) + " bytes, " +
                                  std::to_string(counts[r] * es) + " expected");
    }
    std::memcpy(at, all[r].data(), all[r].size());
    at += all[r].size();
  }
  return Status::Ok();
}

Status ObjectCommunicator::GatherV(const void* send, int64_t count, void* recv,
                                   std::span<const int64_t> counts, DType dtype, int root) {
  if (rank_ == root) return AllGatherV(send, count, recv, counts, dtype);
  std::vector<char> ignored(static_cast<size_t>([&] {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return n;
  }() * DTypeSize(dtype)));
  return AllGatherV(send, count, ignored.data(), counts, dtype);
}

Status ObjectCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                         DType dtype, ReduceOp op) {
  std::vector<char> all(static_cast<size_t>(recv_count * size_ * DTypeSize(dtype)));
  RETURN_IF_ERROR(AllReduce(send, all.data(), recv_count * size_, dtype, op));
  std::memcpy(recv, all.data() + recv_count * rank_ * DTypeSize(dtype),
              static_cast<size_t>(recv_count * DTypeSize(dtype)));
  return Status::Ok();
}

Status ObjectCommunicator::ScatterV(const void* send, std::span<const int64_t> counts, void* recv,
                                    int64_t count, DType dtype, int root) {
  const int64_t es = DTypeSize(dtype);
  int64_t total = 0, before = 0;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (r < rank_) before += counts[r];
    total += counts[r];
  }
  std::vector<char> all(static_cast<size_t>(total * es));
  if (rank_ == root && total > 0) std::memcpy(all.data(), send, all.size());
  RETURN_IF_ERROR(Broadcast(all.data(), total * es, DType::kU8, root));
  if (count > 0) std::memcpy(recv, all.data() + before * es, static_cast<size_t>(count * es));
  return Status::Ok();
}

Status ObjectCommunicator::AllToAllV(const void* send, std::span<const int64_t> send_counts,
                                     void* recv, std::span<const int64_t> recv_counts,
                                     DType dtype) {
  const int64_t es = DTypeSize(dtype);
  int64_t total = 0;
  for (int64_t c : send_counts) total += c;
  ASSIGN_OR_RETURN(auto all, Exchange(send, static_cast<size_t>(total * es)));
  // Rank r's message packs its blocks for ranks 0..size-1; ours is block
  // `rank_`, after the blocks r sent to the ranks before us. Each rank's
  // send counts are learnt from the data it sent: exchanged too.
  std::vector<int64_t> mine(send_counts.begin(), send_counts.end());
  ASSIGN_OR_RETURN(auto counts, Exchange(mine.data(), mine.size() * sizeof(int64_t)));
  char* at = static_cast<char*>(recv);
  for (int r = 0; r < size_; ++r) {
    if (counts[r].size() != static_cast<size_t>(size_) * sizeof(int64_t) ||
        static_cast<int>(recv_counts.size()) != size_) {
      return InvalidArgumentError("all-to-all: rank " + std::to_string(r) +
                                  " passed counts for another number of ranks");
    }
    const auto* theirs = reinterpret_cast<const int64_t*>(counts[r].data());
    int64_t offset = 0;
    for (int j = 0; j < rank_; ++j) offset += theirs[j];
    if (theirs[rank_] != recv_counts[r]) {
      return InvalidArgumentError("all-to-all: rank " + std::to_string(r) + " sends " +
                                  std::to_string(theirs[rank_]) + " elements to rank " +
                                  std::to_string(rank_) + ", which expects " +
                                  std::to_string(recv_counts[r]));
    }
    if (static_cast<size_t>((offset + recv_counts[r]) * es) > all[r].size()) {
      return InvalidArgumentError("all-to-all: rank " + std::to_string(r) + " sent " +
                                  std::to_string(all[r].size()) +
                                  " bytes, fewer than its counts say");
    }
    std::memcpy(at, all[r].data() + offset * es, static_cast<size_t>(recv_counts[r] * es));
    at += recv_counts[r] * es;
  }
  return Status::Ok();
}

Status ObjectCommunicator::Send(const void*, int64_t, DType, int, int) { return NoPointToPoint(); }
Status ObjectCommunicator::Recv(void*, int64_t, DType, int, int) { return NoPointToPoint(); }
Result<Request> ObjectCommunicator::ISend(const void*, int64_t, DType, int, int) {
  return NoPointToPoint();
}
Result<Request> ObjectCommunicator::IRecv(void*, int64_t, DType, int, int) {
  return NoPointToPoint();
}
Result<std::unique_ptr<Communicator>> ObjectCommunicator::Split(int, int) {
  return NoPointToPoint();
}

}  // namespace tessera::python
