#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/utf8.h"

namespace qf::http {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kListenId = 0, kWakeId = 1;
constexpr double kLingerSeconds = 2.0;           // after an error reply: drain what the client still sends
constexpr size_t kMaxLingerBytes = size_t(1) << 20;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

const char* reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool has_token(std::string_view list, std::string_view token) {  // "keep-alive, Upgrade" contains "keep-alive"
  const std::string l = lower(list);
  size_t pos = 0;
  while (pos <= l.size()) {
    size_t end = l.find(',', pos);
    if (end == std::string::npos) end = l.size();
    if (trim(std::string_view(l).substr(pos, end - pos)) == token) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

std::string error_json(std::string_view message, std::string_view type, std::string_view param,
                       std::string_view code) {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  // Messages quote client bytes (clipped and sanitized where they are built); should one still
  // hold invalid UTF-8, it is replaced rather than thrown on the I/O thread.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

// The wake-up channel from other threads to the I/O thread: connections with new output.
struct Notifier {
  int efd = -1;
  std::mutex mu;
  std::vector<uint64_t> dirty;
  void notify(uint64_t id) {
    {
      std::lock_guard<std::mutex> l(mu);
      dirty.push_back(id);
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(efd, &one, sizeof one);
  }
};

class Connection {
 public:
  enum class Phase { Reading, Dispatched, Lingering };
  Connection(int f, uint64_t i, std::shared_ptr<Notifier> n, size_t cap) : fd(f), id(i), notifier(std::move(n)), max_unsent(cap) {}

  // ---- I/O thread only ----
  int fd;
  uint64_t id;
  Phase phase = Phase::Reading;
  std::string in;                 // received, not yet consumed
  bool in_request = false;        // the current request's first byte has arrived
  Clock::time_point since, deadline;
  bool headers_done = false, continue_sent = false;
  size_t body_start = 0, content_length = 0;
  Request req;
  bool keep_alive = true, http10 = false;
  uint32_t events = 0;
  size_t lingered = 0;
  // Since when output has waited with no byte taken by the client (epoch: nothing waits).
  Clock::time_point stalled_since{};

  // ---- shared with Reply (any thread), under mu ----
  std::mutex mu;
  std::string out;
  bool complete = false;     // the whole response is in `out`
  bool close_after = false;  // close once it is written
  bool streaming = false, chunked = false;
  std::atomic<bool> gone{false};
  std::shared_ptr<Notifier> notifier;
  size_t max_unsent;

  // Appends response bytes; false when the client is gone (or stopped reading: then it is gone).
  bool queue(std::string_view data, bool last) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (gone) return false;
      out.append(data);
      if (last) complete = true;
      if (out.size() > max_unsent) gone = true;
    }
    notifier->notify(id);
    return !gone;
  }
};

Reply::~Reply() {
  if (!answered_) send_json(500, error_json("internal error: the request was not answered", "server_error"));
}

void Reply::send(int status, std::string_view content_type, std::string_view body, const Headers& extra) {
  if (answered_) return;
  answered_ = true;
  std::string head = strf("HTTP/1.1 %d %s\r\n", status, reason(status));
  head += "Content-Type: " + std::string(content_type) + "\r\n";
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
  {
    std::lock_guard<std::mutex> l(conn_->mu);
    if (!conn_->keep_alive) conn_->close_after = true;
  }
  head += conn_->keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  conn_->queue(head + std::string(body), true);
}

bool Reply::begin_stream(int status, std::string_view content_type, const Headers& extra) {
  if (answered_) return false;
  answered_ = true;
  std::string head = strf("HTTP/1.1 %d %s\r\n", status, reason(status));
  head += "Content-Type: " + std::string(content_type) + "\r\nCache-Control: no-store\r\n";
  for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
  {
    std::lock_guard<std::mutex> l(conn_->mu);
    conn_->streaming = true;
    // HTTP/1.0 has no chunked encoding: the end of the body is the end of the connection.
    conn_->chunked = !conn_->http10;
    if (conn_->http10) conn_->close_after = true;
    if (!conn_->keep_alive) conn_->close_after = true;
    head += conn_->chunked ? "Transfer-Encoding: chunked\r\n" : "";
    head += conn_->close_after ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  }
  return conn_->queue(head, false);
}

bool Reply::write(std::string_view data) {
  if (data.empty()) return !gone();
  if (!conn_->chunked) return conn_->queue(data, false);
  return conn_->queue(strf("%zx\r\n", data.size()) + std::string(data) + "\r\n", false);
}

void Reply::end_stream() { conn_->queue(conn_->chunked ? "0\r\n\r\n" : "", true); }

bool Reply::gone() const { return conn_->gone; }

struct Server::Impl {
  Limits lim;
  Handler handler;
  int lfd = -1, ep = -1;
  std::shared_ptr<Notifier> notifier = std::make_shared<Notifier>();
  std::unordered_map<uint64_t, std::shared_ptr<Connection>> conns;
  uint64_t next_id = 2;
  std::atomic<bool> stopping{false};
  std::atomic<int> n_open{0};

  void set_events(Connection& c, uint32_t ev) {
    if (c.events == ev) return;
    epoll_event e{};
    e.events = ev;
    e.data.u64 = c.id;
    epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &e);
    c.events = ev;
  }

  void drop(const std::shared_ptr<Connection>& c) {
    c->gone = true;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    conns.erase(c->id);
    n_open = static_cast<int>(conns.size());
  }

  // Answers from the HTTP layer itself (malformed, too large, too slow), then a lingering close.
  void fail_request(const std::shared_ptr<Connection>& c, int status, const std::string& msg) {
    c->phase = Connection::Phase::Dispatched;
    c->keep_alive = false;
    Reply r(c);
    r.send_json(status, error_json(msg, "invalid_request_error"));
  }

  void accept_all() {
    while (true) {
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (static_cast<int>(conns.size()) >= lim.max_connections && !evict_one()) {
        ::close(fd);
        continue;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE pieces go out at once
      auto c = std::make_shared<Connection>(fd, next_id++, notifier, lim.max_unsent_bytes);
      c->since = Clock::now();
      c->deadline = after(lim.idle_timeout_s);
      epoll_event e{};
      e.events = c->events = EPOLLIN | EPOLLRDHUP;
      e.data.u64 = c->id;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
      conns[c->id] = c;
      n_open = static_cast<int>(conns.size());
    }
  }

  // At the connection cap, the connection that has waited longest for its request makes room,
  // so clients that trickle bytes cannot keep new ones out.
  bool evict_one() {
    std::shared_ptr<Connection> victim;
    for (auto& [id, c] : conns)
      if (c->phase != Connection::Phase::Dispatched && (!victim || c->since < victim->since)) victim = c;
    if (!victim) return false;
    drop(victim);
    return true;
  }

  void on_readable(const std::shared_ptr<Connection>& c) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
      if (n > 0) {
        if (c->phase == Connection::Phase::Lingering) {
          c->lingered += static_cast<size_t>(n);
          if (c->lingered > kMaxLingerBytes) return drop(c);
          continue;
        }
        c->in.append(buf, static_cast<size_t>(n));
        if (c->phase == Connection::Phase::Reading && !c->in_request) {
          c->in_request = true;
          c->deadline = after(lim.request_timeout_s);
        }
        // While a request is served, keep what follows (a pipelined request) up to a bound,
        // then stop reading; hang-ups are still reported (EPOLLRDHUP).
        if (c->phase == Connection::Phase::Dispatched && c->in.size() > lim.max_header_bytes + lim.max_body_bytes) {
          set_events(*c, (c->events & ~uint32_t(EPOLLIN)));
          break;
        }
        continue;
      }
      if (n == 0) return drop(c);  // the peer closed: a request it was waiting for is cancelled
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return drop(c);
    }
    if (c->phase == Connection::Phase::Reading) parse(c);
  }

  void parse(const std::shared_ptr<Connection>& c) {
    if (!c->headers_done) {
      while (c->in.compare(0, 2, "\r\n") == 0) c->in.erase(0, 2);  // stray CRLF between requests
      const size_t end = c->in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (c->in.size() > lim.max_header_bytes)
          fail_request(c, 431, strf("request headers: expected at most %zu bytes", lim.max_header_bytes));
        return;
      }
      if (end + 4 > lim.max_header_bytes)
        return fail_request(c, 431, strf("request headers: expected at most %zu bytes, found %zu", lim.max_header_bytes, end + 4));
      if (!parse_head(c, std::string_view(c->in).substr(0, end))) return;
      c->headers_done = true;
      c->body_start = end + 4;
    }
    if (c->in.size() - c->body_start < c->content_length) {
      const std::string* ex = c->req.header("expect");
      if (ex && !c->continue_sent && lower(*ex) == "100-continue") {
        c->continue_sent = true;
        c->queue("HTTP/1.1 100 Continue\r\n\r\n", false);
      }
      return;
    }
    c->req.body = c->in.substr(c->body_start, c->content_length);
    c->in.erase(0, c->body_start + c->content_length);
    c->headers_done = false;
    c->continue_sent = false;
    c->phase = Connection::Phase::Dispatched;
    Request r = std::move(c->req);
    c->req = Request{};
    handler(std::move(r), std::make_shared<Reply>(c));
  }

  // Request line and headers; false after answering an error.
  bool parse_head(const std::shared_ptr<Connection>& c, std::string_view head) {
    Request& r = c->req;
    size_t eol = head.find("\r\n");
    const std::string_view line = head.substr(0, eol);
    const size_t s1 = line.find(' '), s2 = line.rfind(' ');
    if (s1 == std::string_view::npos || s2 == s1) {
      fail_request(c, 400, "request line: expected 'METHOD /path HTTP/1.1'");
      return false;
    }
    r.method = std::string(line.substr(0, s1));
    std::string_view target = line.substr(s1 + 1, s2 - s1 - 1);
    const std::string_view version = line.substr(s2 + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
      fail_request(c, version.rfind("HTTP/", 0) == 0 ? 505 : 400, "request line: expected HTTP/1.1 or HTTP/1.0");
      return false;
    }
    c->http10 = version == "HTTP/1.0";
    if (target.empty() || target.front() != '/') {
      fail_request(c, 400, "request target: expected a path starting with '/'");
      return false;
    }
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    r.query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
    while (eol != std::string_view::npos) {
      const size_t start = eol + 2;
      eol = head.find("\r\n", start);
      const std::string_view h = head.substr(start, eol == std::string_view::npos ? std::string_view::npos : eol - start);
      const size_t colon = h.find(':');
      if (colon == std::string_view::npos || colon == 0 || h.front() == ' ' || h.front() == '\t') {
        fail_request(c, 400, "request headers: expected 'Name: value' lines");
        return false;
      }
      r.headers.emplace_back(lower(h.substr(0, colon)), std::string(trim(h.substr(colon + 1))));
    }
    if (r.header("transfer-encoding")) {
      fail_request(c, 411, "request body: send it with Content-Length (Transfer-Encoding is not supported)");
      return false;
    }
    c->content_length = 0;
    if (const std::string* cl = r.header("content-length")) {
      const bool digits = !cl->empty() && cl->size() <= 18 &&
                          std::all_of(cl->begin(), cl->end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (!digits) {
        fail_request(c, 400, "Content-Length: expected a decimal byte count, found '" + utf8::clip(*cl, 32) + "'");
        return false;
      }
      for (const auto& [k, v] : r.headers)
        if (k == "content-length" && v != *cl) {
          fail_request(c, 400, "Content-Length: sent twice with different values");
          return false;
        }
      c->content_length = std::stoull(*cl);
      if (c->content_length > lim.max_body_bytes) {
        fail_request(c, 413, strf("request body: expected at most %zu bytes, found %zu (Content-Length)", lim.max_body_bytes,
                                  c->content_length));
        return false;
      }
    }
    const std::string* conn = r.header("connection");
    c->keep_alive = c->http10 ? (conn && has_token(*conn, "keep-alive")) : !(conn && has_token(*conn, "close"));
    return true;
  }

  // Writes what is queued; at the end of a response starts the next request or closes.
  void flush(const std::shared_ptr<Connection>& c) {
    bool finished = false, close_after = false;
    {
      std::lock_guard<std::mutex> l(c->mu);
      bool progressed = false;
      while (!c->out.empty()) {
        const ssize_t n = ::send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c->out.erase(0, static_cast<size_t>(n));
          progressed = true;
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->gone = true;
        break;
      }
      if (c->out.empty())
        c->stalled_since = {};
      else if (progressed || c->stalled_since == Clock::time_point{})
        c->stalled_since = Clock::now();
      if (c->gone) {
        c->out.clear();
      } else if (c->out.empty() && c->complete) {
        finished = true;
        close_after = c->close_after;
        c->complete = c->streaming = c->chunked = false;
      }
    }
    if (c->gone) return drop(c);
    const uint32_t base = c->events & ~uint32_t(EPOLLOUT);
    std::unique_lock<std::mutex> l(c->mu);
    const bool pending = !c->out.empty();
    l.unlock();
    set_events(*c, pending ? base | EPOLLOUT : base);
    if (!finished || c->phase != Connection::Phase::Dispatched) return;
    if (close_after) {
      ::shutdown(c->fd, SHUT_WR);
      c->phase = Connection::Phase::Lingering;
      c->deadline = after(kLingerSeconds);
      set_events(*c, EPOLLIN | EPOLLRDHUP);
      return;
    }
    c->phase = Connection::Phase::Reading;
    c->since = Clock::now();
    c->in_request = !c->in.empty();
    c->deadline = after(c->in_request ? lim.request_timeout_s : lim.idle_timeout_s);
    set_events(*c, EPOLLIN | EPOLLRDHUP);
    if (c->in_request) parse(c);
  }

  void sweep() {
    const auto now = Clock::now();
    const auto send_limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lim.send_timeout_s));
    std::vector<std::shared_ptr<Connection>> late, stalled;
    for (auto& [id, c] : conns) {
      // A client that takes none of its answer for send_timeout_s holds its slot no longer:
      // it is gone (a generation for it stops) and the connection is closed.
      if (c->stalled_since != Clock::time_point{} && now - c->stalled_since > send_limit)
        stalled.push_back(c);
      else if (c->phase != Connection::Phase::Dispatched && now > c->deadline)
        late.push_back(c);
    }
    for (auto& c : stalled) drop(c);
    for (auto& c : late) {
      if (c->phase == Connection::Phase::Reading && c->in_request)
        fail_request(c, 408, strf("request: not received within %g s", lim.request_timeout_s));
      else
        drop(c);
    }
  }
};

Server::Server(const Limits& limits, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->lim = limits;
  impl_->handler = std::move(handler);
}

Server::~Server() {
  for (auto& [id, c] : impl_->conns) {
    c->gone = true;
    ::close(c->fd);
  }
  if (impl_->lfd >= 0) ::close(impl_->lfd);
  if (impl_->ep >= 0) ::close(impl_->ep);
  if (impl_->notifier->efd >= 0) ::close(impl_->notifier->efd);
}

int Server::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) fail(ErrorKind::Usage, "port: expected an integer in [0, 65535], found %d", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  if (int e = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res); e != 0)
    fail(ErrorKind::Io, "cannot listen on %s:%d: the host is not an address of this machine (%s)", host.c_str(), port,
         gai_strerror(e));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restarted server bind over its predecessor's TIME_WAIT sockets; on
    // Linux it never lets two sockets listen on one port (SO_REUSEPORT would: not set).
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      impl_->lfd = fd;
      break;
    }
    why = errno == EADDRINUSE ? "the port is taken (another server listens there)" : std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (impl_->lfd < 0) fail(ErrorKind::Io, "cannot listen on %s:%d: %s", host.c_str(), port, why.c_str());
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(impl_->lfd, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                             : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  impl_->ep = epoll_create1(EPOLL_CLOEXEC);
  impl_->notifier->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = kListenId;
  epoll_ctl(impl_->ep, EPOLL_CTL_ADD, impl_->lfd, &e);
  e.data.u64 = kWakeId;
  epoll_ctl(impl_->ep, EPOLL_CTL_ADD, impl_->notifier->efd, &e);
  return bound;
}

void Server::run() {
  Impl& s = *impl_;
  if (s.ep < 0) fail(ErrorKind::Internal, "http::Server::run before bind");
  epoll_event evs[64];
  auto next_sweep = Clock::now();
  while (!s.stopping) {
    const int n = epoll_wait(s.ep, evs, 64, 100);
    for (int i = 0; i < n; i++) {
      const uint64_t id = evs[i].data.u64;
      if (id == kListenId) {
        s.accept_all();
        continue;
      }
      if (id == kWakeId) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(s.notifier->efd, &v, sizeof v);
        std::vector<uint64_t> dirty;
        {
          std::lock_guard<std::mutex> l(s.notifier->mu);
          dirty.swap(s.notifier->dirty);
        }
        std::sort(dirty.begin(), dirty.end());
        dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
        for (uint64_t d : dirty)
          if (auto it = s.conns.find(d); it != s.conns.end()) s.flush(std::shared_ptr<Connection>(it->second));
        continue;
      }
      auto it = s.conns.find(id);
      if (it == s.conns.end()) continue;
      std::shared_ptr<Connection> c = it->second;
      if (evs[i].events & EPOLLERR) {
        s.drop(c);
        continue;
      }
      if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) s.on_readable(c);
      if (s.conns.count(id) && (evs[i].events & EPOLLOUT)) s.flush(c);
    }
    if (Clock::now() >= next_sweep) {
      s.sweep();
      next_sweep = after(0.1);
    }
  }
}

// Async-signal-safe (an atomic store): the loop sees it within its 100 ms wait.
void Server::stop() { impl_->stopping = true; }

void check_bindable(const std::string& host, int port) {
  Server probe(Limits{}, nullptr);
  probe.bind(host, port);
}

int Server::open_connections() const { return impl_->n_open; }

}  // namespace qf::http
