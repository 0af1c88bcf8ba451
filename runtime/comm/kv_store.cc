#include "runtime/comm/kv_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "runtime/comm/tcp.h"

namespace tessera {
namespace {

// Requests: op (1 byte), key length (4), key, value length (4), value.
// Replies: found (1 byte), value length (4), value.
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;
// Server-side reads of a request that has begun may take this long.
constexpr auto kRequestTimeout = std::chrono::seconds(30);

// Appends `s` framed: its length (32 bits, network order), then its bytes.
// A request or reply goes out in one write: several small ones would wait
// on each other's acknowledgements (Nagle's algorithm against delayed
// ACKs: 40 ms a round trip).
void AppendString(std::string* out, const std::string& s) {
  const uint32_t len = htonl(static_cast<uint32_t>(s.size()));
  out->append(reinterpret_cast<const char*>(&len), 4);
  out->append(s);
}

Result<std::string> RecvString(int fd, uint32_t max, tcp::Clock::time_point deadline,
                               const std::string& what) {
  uint32_t len = 0;
  RETURN_IF_ERROR(tcp::RecvAll(fd, &len, 4, deadline, what));
  len = ntohl(len);
  if (len > max) return DataLossError(what + ": a string of " + std::to_string(len) + " bytes");
  std::string s(len, '\0');
  RETURN_IF_ERROR(tcp::RecvAll(fd, s.data(), len, deadline, what));
  return s;
}

}  // namespace

Result<std::unique_ptr<KvServer>> KvServer::Start(int port) {
  ASSIGN_OR_RETURN(tcp::Socket listener, tcp::Listen(port, "key-value store"));
  ASSIGN_OR_RETURN(int bound, tcp::BoundPort(listener));
  std::unique_ptr<KvServer> s(new KvServer());
  s->port_ = bound;
  s->listener_ = listener.Release();
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

KvServer::~KvServer() {
  stopping_ = true;
  shutdown(listener_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  close(listener_);
  std::vector<std::thread> handlers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clients_) shutdown(fd, SHUT_RDWR);
    handlers.swap(handlers_);
  }
  for (std::thread& t : handlers) t.join();
}

void KvServer::Serve() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      close(fd);
      break;
    }
    clients_.push_back(fd);
    handlers_.emplace_back([this, fd] { Handle(fd); });
  }
}

void KvServer::Handle(int fd) {
  const std::string what = "key-value store";
  while (!stopping_) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 200);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    if (r < 0) break;
    const auto deadline = tcp::Clock::now() + kRequestTimeout;
    uint8_t op = 0;
    if (!tcp::RecvAll(fd, &op, 1, deadline, what).ok()) break;
    Result<std::string> key = RecvString(fd, kMaxKey, deadline, what);
    if (!key.ok()) break;
    Result<std::string> value = RecvString(fd, kMaxValue, deadline, what);
    if (!value.ok()) break;
    uint8_t found = 1;
    std::string reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (op == kSet) {
        data_[*key] = std::move(*value);
      } else if (op == kGet) {
        auto it = data_.find(*key);
        found = it != data_.end();
        if (found) reply = it->second;
      } else if (op == kAdd) {
        int64_t delta = 0, have = 0;
        std::from_chars(value->data(), value->data() + value->size(), delta);
        const std::string& cur = data_[*key];
        std::from_chars(cur.data(), cur.data() + cur.size(), have);
        reply = std::to_string(have + delta);
        data_[*key] = reply;
      } else {
        break;  // not our protocol
      }
    }
    std::string message(1, static_cast<char>(found));
    AppendString(&message, reply);
    if (!tcp::SendAll(fd, message.data(), message.size(), deadline, what).ok()) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < clients_.size(); ++i) {
    if (clients_[i] == fd) {
      clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  close(fd);
}

Result<std::unique_ptr<KvClient>> KvClient::Connect(const std::string& host, int port,
                                                    std::chrono::milliseconds timeout) {
  const std::string address = host + ":" + std::to_string(port);
  ASSIGN_OR_RETURN(tcp::Socket s, tcp::Connect(host, port, tcp::Clock::now() + timeout,
                                               "key-value store at " + address));
  std::unique_ptr<KvClient> c(new KvClient());
  c->fd_ = s.Release();
  c->address_ = address;
  return c;
}

KvClient::~KvClient() {
  if (fd_ >= 0) close(fd_);
}

Result<std::pair<bool, std::string>> KvClient::Call(uint8_t op, const std::string& key,
                                                    const std::string& value) {
  if (key.size() > kMaxKey || value.size() > kMaxValue) {
    return InvalidArgumentError("key-value store: key or value too long (key '" +
                                key.substr(0, 64) + "')");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "key-value store at " + address_ + " (key '" + key + "')";
  if (fd_ < 0) return AbortedError(what + ": the connection was lost by an earlier call");
  const auto deadline = tcp::Clock::now() + kRequestTimeout;
  uint8_t found = 0;
  std::string reply;
  std::string message(1, static_cast<char>(op));
  AppendString(&message, key);
  AppendString(&message, value);
  Status s = tcp::SendAll(fd_, message.data(), message.size(), deadline, what);
  if (s.ok()) s = tcp::RecvAll(fd_, &found, 1, deadline, what);
  if (s.ok()) {
    Result<std::string> r = RecvString(fd_, kMaxValue, deadline, what);
    s = r.status();
    if (r.ok()) reply = std::move(*r);
  }
  if (!s.ok()) {
    // Part of a request or reply may be in flight: the stream is out of
    // step, so no later call may use it.
    close(fd_);
    fd_ = -1;
    return s;
  }
  return std::make_pair(found != 0, std::move(reply));
}

Status KvClient::Set(const std::string& key, const std::string& value) {
  return Call(kSet, key, value).status();
}

Result<bool> KvClient::Has(const std::string& key) {
  ASSIGN_OR_RETURN(auto r, Call(kGet, key, ""));
  return r.first;
}

Result<std::string> KvClient::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = tcp::Clock::now() + timeout;
  auto wait = std::chrono::milliseconds(1);
  while (true) {
    ASSIGN_OR_RETURN(auto r, Call(kGet, key, ""));
    if (r.first) return std::move(r.second);
    if (tcp::Clock::now() >= deadline) {
      return DeadlineExceededError("key-value store at " + address_ + ": key '" + key +
                                   "' was not set within " + std::to_string(timeout.count()) +
                                   " ms");
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(50));
  }
}

Result<int64_t> KvClient::Add(const std::string& key, int64_t delta) {
  ASSIGN_OR_RETURN(auto r, Call(kAdd, key, std::to_string(delta)));
  int64_t v = 0;
  std::from_chars(r.second.data(), r.second.data() + r.second.size(), v);
  return v;
}

}  // namespace tessera
