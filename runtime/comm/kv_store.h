// A small TCP key-value store for bootstrap data: the Gloo backend's
// rendezvous (every rank's transport address; Gloo's Debian build has no
// TCP store of its own) and the launcher's bookkeeping. Rank 0 (or the
// launcher) serves it; every process connects. Never tensors.
//
// Keys and values are byte strings (values up to 64 MiB). Get waits until
// the key is set or the deadline passes, so ranks may arrive in any order.
#ifndef TESSERA_RUNTIME_COMM_KV_STORE_H_
#define TESSERA_RUNTIME_COMM_KV_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace tessera {

class KvServer {
 public:
  // Listens on `port` of every address (0: a free port), serving on a
  // thread of its own until destroyed.
  static Result<std::unique_ptr<KvServer>> Start(int port);
  ~KvServer();
  int port() const { return port_; }

 private:
  KvServer() = default;
  void Serve();
  void Handle(int fd);

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::mutex mu_;  // guards data_, clients_, handlers_
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;
  std::vector<std::thread> handlers_;
};

class KvClient {
 public:
  // Connects to host:port, retrying until `timeout` (the server may not be
  // up yet). Thread-safe.
  static Result<std::unique_ptr<KvClient>> Connect(const std::string& host, int port,
                                                   std::chrono::milliseconds timeout);
  ~KvClient();

  Status Set(const std::string& key, const std::string& value);
  // The value of `key`, waiting until it is set; DeadlineExceeded naming
  // the key after `timeout`.
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Whether `key` is set now.
  Result<bool> Has(const std::string& key);
  // Adds `delta` to the integer at `key` (absent: 0) and returns the sum.
  Result<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& address() const { return address_; }

 private:
  KvClient() = default;
  // One request, one reply: (found, value).
  Result<std::pair<bool, std::string>> Call(uint8_t op, const std::string& key,
                                            const std::string& value);
  std::mutex mu_;
  int fd_ = -1;
  std::string address_;  // "host:port", for errors
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_KV_STORE_H_
