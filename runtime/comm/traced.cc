#include "runtime/comm/traced.h"

#include <string>
#include <utility>

#include "core/trace.h"

namespace tessera {
namespace {

class Traced : public Communicator {
 public:
  Traced(Communicator* inner, std::unique_ptr<Communicator> owned)
      : inner_(inner), owned_(std::move(owned)) {
    name_ = inner_->name();
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }

  Status Barrier() override {
    TraceSpan span("comm", Label("Barrier"));
    return inner_->Barrier();
  }
  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    TraceSpan span("comm", Label("Broadcast"), Bytes(count, dtype));
    return inner_->Broadcast(buf, count, dtype, root);
  }
  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    TraceSpan span("comm", Label("AllReduce"), Bytes(count, dtype));
    return inner_->AllReduce(send, recv, count, dtype, op);
  }
  Status AllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    TraceSpan span("comm", Label("AllGather"), Bytes(count, dtype));
    return inner_->AllGather(send, count, recv, dtype);
  }
  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    TraceSpan span("comm", Label("AllGatherV"), Bytes(count, dtype));
    return inner_->AllGatherV(send, count, recv, counts, dtype);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    TraceSpan span("comm", Label("ReduceScatter"), Bytes(recv_count * size(), dtype));
    return inner_->ReduceScatter(send, recv, recv_count, dtype, op);
  }
  Status Gather(const void* send, int64_t count, void* recv, DType dtype, int root) override {
    TraceSpan span("comm", Label("Gather"), Bytes(count, dtype));
    return inner_->Gather(send, count, recv, dtype, root);
  }
  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    TraceSpan span("comm", Label("GatherV"), Bytes(count, dtype));
    return inner_->GatherV(send, count, recv, counts, dtype, root);
  }
  Status Scatter(const void* send, void* recv, int64_t count, DType dtype, int root) override {
    TraceSpan span("comm", Label("Scatter"), Bytes(count, dtype));
    return inner_->Scatter(send, recv, count, dtype, root);
  }
  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    TraceSpan span("comm", Label("ScatterV"), Bytes(count, dtype));
    return inner_->ScatterV(send, counts, recv, count, dtype, root);
  }
  Status AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    TraceSpan span("comm", Label("AllToAll"), Bytes(count * size(), dtype));
    return inner_->AllToAll(send, recv, count, dtype);
  }
  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    TraceSpan span("comm", Label("AllToAllV"));
    return inner_->AllToAllV(send, send_counts, recv, recv_counts, dtype);
  }
  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    TraceSpan span("pipeline", Label("Send to " + std::to_string(peer)), Bytes(count, dtype));
    return inner_->Send(buf, count, dtype, peer, tag);
  }
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    TraceSpan span("pipeline", Label("Recv from " + std::to_string(peer)), Bytes(count, dtype));
    return inner_->Recv(buf, count, dtype, peer, tag);
  }
  Result<Request> IAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                             ReduceOp op) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->IAllReduce(send, recv, count, dtype, op));
    return Pending(std::move(r), "comm", Label("IAllReduce"), Bytes(count, dtype), begin);
  }
  Result<Request> IReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                 ReduceOp op) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->IReduceScatter(send, recv, recv_count, dtype, op));
    return Pending(std::move(r), "comm", Label("IReduceScatter"), Bytes(recv_count * size(), dtype),
                   begin);
  }
  Result<Request> IAllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->IAllGather(send, count, recv, dtype));
    return Pending(std::move(r), "comm", Label("IAllGather"), Bytes(count, dtype), begin);
  }
  Result<Request> IAllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->IAllToAll(send, recv, count, dtype));
    return Pending(std::move(r), "comm", Label("IAllToAll"), Bytes(count * size(), dtype), begin);
  }
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->ISend(buf, count, dtype, peer, tag));
    return Pending(std::move(r), "pipeline", Label("ISend to " + std::to_string(peer)),
                   Bytes(count, dtype), begin);
  }
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    const int64_t begin = Trace::NowNs();
    ASSIGN_OR_RETURN(Request r, inner_->IRecv(buf, count, dtype, peer, tag));
    return Pending(std::move(r), "pipeline", Label("IRecv from " + std::to_string(peer)),
                   Bytes(count, dtype), begin);
  }
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    TraceSpan span("comm", Label("Split"));
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part, inner_->Split(color, key));
    if (part == nullptr) return part;
    Communicator* raw = part.get();
    return std::unique_ptr<Communicator>(std::make_unique<Traced>(raw, std::move(part)));
  }

 private:
  // A non-blocking operation, recorded from issue to the end of its Wait
  // (and its Wait on its own, "wait ...").
  class PendingImpl : public Request::Impl {
   public:
    PendingImpl(Request inner, std::string_view category, std::string name, std::string args,
                int64_t begin)
        : inner_(std::move(inner)),
          category_(category),
          trace_(Trace::Current()),
          name_(std::move(name)),
          args_(std::move(args)),
          begin_(begin) {}
    Status Wait() override {
      Status s;
      {
        TraceSpan wait(category_, "wait " + name_);
        s = inner_.Wait();
      }
      if (trace_ != nullptr) {
        trace_->Add(std::move(name_), category_, begin_, Trace::NowNs(), std::move(args_));
      }
      return s;
    }

   private:
    Request inner_;
    std::string_view category_;
    Trace* trace_;
    std::string name_;
    std::string args_;
    int64_t begin_;
  };

  // `category` is a literal ("comm", "pipeline").
  Request Pending(Request r, std::string_view category, std::string name, std::string args,
                  int64_t begin) {
    if (Trace::Current() == nullptr) return r;
    return Request(std::make_unique<PendingImpl>(std::move(r), category, std::move(name),
                                                 std::move(args), begin));
  }
  std::string Label(const std::string& kind) const {
    return Trace::Current() == nullptr ? std::string() : kind + " " + name();
  }
  static std::string Bytes(int64_t count, DType dtype) {
    if (Trace::Current() == nullptr) return {};
    return "\"bytes\": " + std::to_string(count * DTypeSize(dtype));
  }

  Communicator* inner_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace

std::unique_ptr<Communicator> TracedCommunicator(Communicator& inner) {
  return std::make_unique<Traced>(&inner, nullptr);
}

}  // namespace tessera
