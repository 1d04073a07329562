// A small HTTP/1.1 server for qflash-server: one thread owns every socket (epoll, non-blocking),
// so a client that sends slowly or not at all holds a connection slot and nothing else; no
// worker thread ever blocks on a socket. Requests are framed by Content-Length only (a chunked
// request body gets 411); responses are whole (Content-Length) or streamed (chunked).
//
// Limits (Limits below): header bytes (431), body bytes (413, before the body is read), a
// deadline for the whole request counted from its first byte (408: a client trickling one
// header line every few seconds does not extend it), an idle deadline between keep-alive
// requests, a connection cap (past it the connection idle or slow for longest is closed), a cap
// on output a client has not read and a deadline for a client that reads none of it (past
// either the client counts as gone and its connection is closed).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qf::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // as sent ("GET", "POST", ...)
  std::string path;    // the target without its query string
  std::string query;
  Headers headers;     // names lower-cased, in order
  std::string body;
  const std::string* header(std::string_view lower_name) const;
};

struct Limits {
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = size_t(16) << 20;
  double request_timeout_s = 10;  // from a request's first byte to its last
  double idle_timeout_s = 30;     // a kept-alive connection waiting for its next request
  int max_connections = 256;
  size_t max_unsent_bytes = size_t(16) << 20;  // response bytes the client has not read yet
  double send_timeout_s = 30;  // output waits this long with no byte taken by the client: gone
};

// An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}.
std::string error_json(std::string_view message, std::string_view type, std::string_view param = {},
                       std::string_view code = {});

class Connection;

// Binds and releases host:port, so that a taken or invalid address is reported before a long
// model load; throws like Server::bind.
void check_bindable(const std::string& host, int port);

// The answer to one request. Usable from any thread; exactly one of send() or
// begin_stream()...end_stream() per request. Writes after the client went away are dropped.
class Reply {
 public:
  explicit Reply(std::shared_ptr<Connection> c) : conn_(std::move(c)) {}
  ~Reply();  // a request left unanswered gets a 500
  void send(int status, std::string_view content_type, std::string_view body, const Headers& extra = {});
  void send_json(int status, std::string_view body, const Headers& extra = {}) {
    send(status, "application/json", body, extra);
  }
  // Streamed response: headers now, then pieces; returns false once the client is gone.
  bool begin_stream(int status, std::string_view content_type, const Headers& extra = {});
  bool write(std::string_view data);
  void end_stream();
  // The client closed the connection or stopped reading: stop working for it.
  bool gone() const;

 private:
  std::shared_ptr<Connection> conn_;
  bool answered_ = false;
};

class Server {
 public:
  // Called on the I/O thread for each complete request. It must not block: slow work goes to
  // other threads, which answer through the Reply.
  using Handler = std::function<void(Request&&, std::shared_ptr<Reply>)>;
  Server(const Limits& limits, Handler handler);
  ~Server();
  // Binds `host:port` exclusively (SO_REUSEADDR for TIME_WAIT only, never SO_REUSEPORT) and
  // listens. Returns the bound port (port 0 picks a free one). Throws qf::Error(Io) naming the
  // address and the reason (taken, not an address of this machine, ...).
  int bind(const std::string& host, int port);
  void run();   // serves until stop()
  void stop();  // from any thread
  int open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qf::http
