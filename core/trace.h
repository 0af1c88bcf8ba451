// A rank's timeline: intervals (compute per operator, collectives from
// issue to completion, pipeline sends and waits, the optimizer, checkpoint
// I/O) recorded while tracing is on, written as Chrome trace-event JSON
// ("X" complete events, pid = the rank, tid = the recording thread, times
// in microseconds of CLOCK_MONOTONIC, so ranks on one host line up), which
// chrome://tracing and Perfetto (ui.perfetto.dev) open.
//
// Code marks intervals with TraceSpan; it costs one thread-local load when
// the calling thread has no trace. A rank's thread turns tracing on with
// Trace::SetCurrent (ScopedTrace); threads a rank starts (async writers)
// take its trace along with ScopedTrace too.
#ifndef TESSERA_CORE_TRACE_H_
#define TESSERA_CORE_TRACE_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tessera {

class Trace {
 public:
  explicit Trace(int rank) : rank_(rank) {}
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // The calling thread's trace; null when it is not tracing.
  static Trace* Current();
  // Makes `trace` the calling thread's (null stops); returns the previous.
  static Trace* SetCurrent(Trace* trace);
  // Nanoseconds of CLOCK_MONOTONIC.
  static int64_t NowNs();

  int rank() const { return rank_; }
  // One interval [begin_ns, end_ns) of `category` ("forward", "backward",
  // "comm", "pipeline", "optimizer", "checkpoint", "step"); `args` is a
  // JSON object's members ("\"bytes\": 64") or empty. Thread-safe.
  void Add(std::string name, std::string_view category, int64_t begin_ns, int64_t end_ns,
           std::string args = {});
  size_t size() const;
  // {"traceEvents": [...]}: every interval, and the rank's and its
  // threads' names.
  std::string Json() const;

 private:
  struct Event {
    std::string name;
    std::string category;
    int64_t begin_ns = 0;
    int64_t end_ns = 0;
    int tid = 0;
    std::string args;
  };
  int ThreadId();  // under mu_

  int rank_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::vector<std::thread::id> threads_;  // tid = index
};

// Records [construction, destruction) into the calling thread's trace, if
// any.
class TraceSpan {
 public:
  TraceSpan(std::string_view category, std::string_view name, std::string args = {})
      : trace_(Trace::Current()) {
    if (trace_ == nullptr) return;
    category_ = category;
    name_ = name;
    args_ = std::move(args);
    begin_ = Trace::NowNs();
  }
  ~TraceSpan() {
    if (trace_ != nullptr) {
      trace_->Add(std::move(name_), category_, begin_, Trace::NowNs(), std::move(args_));
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* trace_;
  std::string_view category_;
  std::string name_;
  std::string args_;
  int64_t begin_ = 0;
};

// Sets the calling thread's trace for a scope, restoring the previous.
class ScopedTrace {
 public:
  explicit ScopedTrace(Trace* trace) : previous_(Trace::SetCurrent(trace)) {}
  ~ScopedTrace() { Trace::SetCurrent(previous_); }
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;

 private:
  Trace* previous_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_TRACE_H_
