// TcpStoreServer / TcpStoreClient: see tcp_store.h.
#include "tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace traind::comm {
namespace {

using Clock = std::chrono::steady_clock;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

constexpr size_t kMaxField = 64u << 20;  // a key or value longer than this is a protocol error

// One connection's unparsed bytes on the server.
struct Conn {
  int fd = -1;
  std::string in;
};

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& addr, int port) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const char* host = addr.empty() || addr == "0.0.0.0" ? nullptr : addr.c_str();
  if (const int rc = ::getaddrinfo(host, port_str.c_str(), &hints, &res); rc != 0) {
    return Status::Unavailable("rendezvous store: cannot resolve master_addr " + addr + ": " +
                               ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (s->listen_fd_ < 0) {
    return Status::Unavailable("rendezvous store: rank 0 cannot listen on " + addr + ":" +
                               port_str + " (" + last_error +
                               "); is the port taken by another run? set distributed.master_port");
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return Status::Internal("rendezvous store: pipe failed");
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  if (thread_.joinable()) {
    const char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpStoreServer::Loop() {
  std::vector<Conn> conns;
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conns.push_back(Conn{fd, {}});
      }
    }
    std::vector<Conn> alive;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      bool ok = true;
      if (fds[i + 2].revents != 0) {
        char buf[65536];
        const ssize_t r = ::recv(c.fd, buf, sizeof(buf), 0);
        if (r <= 0 && !(r < 0 && errno == EINTR)) ok = false;
        if (r > 0) c.in.append(buf, static_cast<size_t>(r));
      }
      // Every complete request in the buffer.
      while (ok) {
        const auto* p = reinterpret_cast<const unsigned char*>(c.in.data());
        if (c.in.size() < 5) break;
        const uint32_t klen = GetU32(p + 1);
        if (klen > kMaxField) { ok = false; break; }
        if (c.in.size() < 9 + static_cast<size_t>(klen)) break;
        const uint32_t vlen = GetU32(p + 5 + klen);
        if (vlen > kMaxField) { ok = false; break; }
        const size_t total = 9 + static_cast<size_t>(klen) + vlen;
        if (c.in.size() < total) break;
        const char op = c.in[0];
        std::string key = c.in.substr(5, klen);
        std::vector<char> value(c.in.begin() + 9 + klen, c.in.begin() + static_cast<long>(total));
        c.in.erase(0, total);
        std::string reply;
        if (op == 'S') {
          data_[key] = std::move(value);
          reply.push_back(0);
          PutU32(&reply, 0);
        } else if (op == 'X') {
          const bool existed = data_.count(key) > 0;
          if (!existed) data_[key] = std::move(value);
          reply.push_back(existed ? 1 : 0);
          PutU32(&reply, 0);
        } else if (op == 'M') {
          // Raise to at least the request's integer (absent = -1); the reply holds the value now.
          const auto parse = [](const std::vector<char>& v) {
            return std::strtoll(std::string(v.begin(), v.end()).c_str(), nullptr, 10);
          };
          auto it = data_.find(key);
          const long long want = parse(value);
          const long long now = it == data_.end() ? want : std::max(parse(it->second), want);
          const std::string text = std::to_string(now);
          data_[key] = std::vector<char>(text.begin(), text.end());
          reply.push_back(0);
          PutU32(&reply, static_cast<uint32_t>(text.size()));
          reply += text;
        } else if (op == 'G') {
          auto it = data_.find(key);
          if (it == data_.end()) {
            reply.push_back(1);
            PutU32(&reply, 0);
          } else {
            reply.push_back(0);
            PutU32(&reply, static_cast<uint32_t>(it->second.size()));
            reply.append(it->second.data(), it->second.size());
          }
        } else {
          ok = false;
          break;
        }
        if (!WriteAll(c.fd, reply.data(), reply.size())) ok = false;
      }
      if (ok) {
        alive.push_back(std::move(c));
      } else {
        ::close(c.fd);
      }
    }
    conns = std::move(alive);
  }
  for (const Conn& c : conns) ::close(c.fd);
}

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& addr, int port,
                                                                 const std::string& prefix,
                                                                 std::chrono::milliseconds timeout,
                                                                 const std::string& who_hosts) {
  std::unique_ptr<TcpStoreClient> c(new TcpStoreClient());
  c->prefix_ = prefix;
  c->where_ = addr + ":" + std::to_string(port);
  c->timeout_ = timeout;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::string last_error;
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = std::string("cannot resolve: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          c->fd_ = fd;
          break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (c->fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      return Status::Unavailable(
          "rendezvous: no store at " + c->where_ + " within " +
          std::to_string(timeout.count() / 1000.0).substr(0, 5) + " s (" + last_error + "): " +
          who_hosts);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(c->fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return c;
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpStoreClient::Request(char op, const std::string& key, const std::string& value,
                               uint8_t* status, std::string* reply) {
  const std::string full = prefix_ + key;
  std::string msg;
  msg.push_back(op);
  PutU32(&msg, static_cast<uint32_t>(full.size()));
  msg += full;
  PutU32(&msg, static_cast<uint32_t>(value.size()));
  msg += value;
  unsigned char head[5];
  if (!WriteAll(fd_, msg.data(), msg.size()) ||
      !ReadAll(fd_, reinterpret_cast<char*>(head), sizeof(head))) {
    return Status::Unavailable("rendezvous store at " + where_ +
                               " closed the connection (rank 0 gone?)");
  }
  *status = head[0];
  reply->assign(GetU32(head + 1), '\0');
  if (!reply->empty() && !ReadAll(fd_, reply->data(), reply->size())) {
    return Status::Unavailable("rendezvous store at " + where_ + " closed the connection");
  }
  return Status::Ok();
}

Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  uint8_t st = 0;
  std::string reply;
  return Request('S', key, value, &st, &reply);
}

Status TcpStoreClient::TryGet(const std::string& key, std::string* value, bool* found) {
  uint8_t st = 0;
  TRAIND_RETURN_IF_ERROR(Request('G', key, "", &st, value));
  *found = st == 0;
  return Status::Ok();
}

Status TcpStoreClient::RaiseTo(const std::string& key, int64_t value, int64_t* now) {
  uint8_t st = 0;
  std::string reply;
  TRAIND_RETURN_IF_ERROR(Request('M', key, std::to_string(value), &st, &reply));
  char* end = nullptr;
  *now = std::strtoll(reply.c_str(), &end, 10);
  if (reply.empty() || *end != '\0') {
    return Status::Unavailable("rendezvous store at " + where_ + " answered '" + reply +
                               "' to a raise of " + key + " (not a store of this traind version?)");
  }
  return Status::Ok();
}

Status TcpStoreClient::SetIfAbsent(const std::string& key, const std::string& value, bool* existed) {
  uint8_t st = 0;
  std::string reply;
  TRAIND_RETURN_IF_ERROR(Request('X', key, value, &st, &reply));
  *existed = st != 0;
  return Status::Ok();
}

}  // namespace traind::comm
