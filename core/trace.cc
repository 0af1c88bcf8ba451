#include "core/trace.h"

#include <time.h>

#include <cstdio>

#include "core/utf8.h"

namespace tessera {
namespace {

thread_local Trace* current_trace = nullptr;

// `s` as a JSON string's contents.
void AppendEscaped(std::string_view s, std::string* out) {
  const std::string text = IsUtf8(s) ? std::string(s) : PrintableText(s);
  for (char c : text) {
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else {
      *out += c;
    }
  }
}

}  // namespace

Trace* Trace::Current() { return current_trace; }

Trace* Trace::SetCurrent(Trace* trace) {
  Trace* previous = current_trace;
  current_trace = trace;
  return previous;
}

int64_t Trace::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int Trace::ThreadId() {
  const std::thread::id me = std::this_thread::get_id();
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (threads_[i] == me) return static_cast<int>(i);
  }
  threads_.push_back(me);
  return static_cast<int>(threads_.size() - 1);
}

void Trace::Add(std::string name, std::string_view category, int64_t begin_ns, int64_t end_ns,
                std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(
      {std::move(name), std::string(category), begin_ns, end_ns, ThreadId(), std::move(args)});
}

size_t Trace::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string Trace::Json() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": "
                "\"rank %d\"}}",
                rank_, rank_);
  out += buf;
  for (size_t t = 0; t < threads_.size(); ++t) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %zu, "
                  "\"args\": {\"name\": \"%s\"}}",
                  rank_, t, t == 0 ? "rank thread" : "helper thread");
    out += buf;
  }
  for (const Event& e : events_) {
    out += ",\n{\"ph\": \"X\", \"name\": \"";
    AppendEscaped(e.name, &out);
    out += "\", \"cat\": \"";
    AppendEscaped(e.category, &out);
    std::snprintf(buf, sizeof(buf), "\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f",
                  rank_, e.tid, e.begin_ns / 1e3, (e.end_ns - e.begin_ns) / 1e3);
    out += buf;
    if (!e.args.empty()) out += ", \"args\": {" + e.args + "}";
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

}  // namespace tessera
