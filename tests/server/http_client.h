// A blocking HTTP/1.1 client for the server tests, on raw sockets so that a test can also
// misbehave on purpose (send half a request, trickle headers, hang up early).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qf::test {

struct HttpResponse {
  bool ok = false;  // a whole response arrived
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

inline int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Reads one response from `fd` within `timeout_s`.
inline HttpResponse read_response(int fd, double timeout_s) {
  HttpResponse r;
  std::string buf;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto fill = [&]() {
    const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
    if (ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char tmp[65536];
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
    return true;
  };
  size_t he;
  while (true) {
    he = buf.find("\r\n\r\n");
    if (he != std::string::npos) {
      if (buf.compare(0, 12, "HTTP/1.1 100") == 0) {  // interim response
        buf.erase(0, he + 4);
        continue;
      }
      break;
    }
    if (!fill()) return r;
  }
  r.status = std::atoi(buf.c_str() + 9);
  size_t pos = buf.find("\r\n") + 2;
  while (pos < he) {
    const size_t e = buf.find("\r\n", pos);
    const std::string line = buf.substr(pos, e - pos);
    const size_t c = line.find(':');
    std::string k = line.substr(0, c);
    for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    r.headers[k] = line.substr(line.find_first_not_of(' ', c + 1));
    pos = e + 2;
  }
  std::string rest = buf.substr(he + 4);
  buf = std::move(rest);
  if (r.headers.count("content-length")) {
    const size_t n = std::stoull(r.headers["content-length"]);
    while (buf.size() < n)
      if (!fill()) return r;
    r.body = buf.substr(0, n);
    r.ok = true;
    return r;
  }
  if (r.headers["transfer-encoding"] == "chunked") {
    size_t at = 0;
    while (true) {
      size_t e;
      while ((e = buf.find("\r\n", at)) == std::string::npos)
        if (!fill()) return r;
      const size_t n = std::stoull(buf.substr(at, e - at), nullptr, 16);
      while (buf.size() < e + 2 + n + 2)
        if (!fill()) return r;
      r.body += buf.substr(e + 2, n);
      at = e + 2 + n + 2;
      if (n == 0) break;
    }
    r.ok = true;
    return r;
  }
  while (fill()) {
  }
  r.body = buf;
  r.ok = true;
  return r;
}

inline HttpResponse request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                            const std::string& extra_headers = "", double timeout_s = 120) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  send_all(fd, req);
  HttpResponse r = read_response(fd, timeout_s);
  ::close(fd);
  return r;
}

inline HttpResponse post(int port, const std::string& path, const nlohmann::json& body) {
  return request(port, "POST", path, body.dump());
}

// The data payloads of a server-sent event stream, "[DONE]" included as a string.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

}  // namespace qf::test
