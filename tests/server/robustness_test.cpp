// The server under clients that misbehave: slow or oversized requests, too many at once, and
// clients that leave. Each case names the limit it tests (docs/SERVER.md, "Limits").
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "tests/server/server_fixture.h"

namespace qf::test {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

json stats_of(int port) { return json::parse(request(port, "GET", "/v1/stats").body); }

// A request whose generation runs for many seconds unless its client leaves.
std::string long_request(bool stream) {
  const std::string body = json{{"prompt", "def main():\n"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", stream}}.dump();
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Waits until the stream on `fd` has sent its first event.
bool wait_first_event(int fd, double timeout_s) {
  std::string got;
  const auto t0 = Clock::now();
  while (got.find("data: ") == std::string::npos && seconds_since(t0) < timeout_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return got.find("data: ") != std::string::npos;
}

// 8 connections that send one header line every 2 s hold 8 connection slots and nothing else:
// /health and / keep answering at once, and each slow request is cut off (408) when its whole
// deadline passes, however regularly its lines come.
TEST(ServerRobustness, SlowClientsDoNotStopOthers) {
  ServerOptions so;
  so.request_timeout_s = 5;
  RunningServer s(so);
  std::vector<int> slow;
  for (int i = 0; i < 8; i++) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\n"));
    slow.push_back(fd);
  }
  const auto t0 = Clock::now();
  int line = 0;
  while (seconds_since(t0) < 4.5) {
    for (int fd : slow) send_all(fd, "X-Slow-" + std::to_string(line) + ": 1\r\n");
    line++;
    for (const char* path : {"/health", "/"}) {
      const auto t = Clock::now();
      auto r = request(s.port, "GET", path, "", "", 2.0);
      EXPECT_TRUE(r.ok && r.status == 200) << path << " did not answer while slow clients trickle";
      EXPECT_LT(seconds_since(t), 1.0) << path;
    }
    std::this_thread::sleep_for(std::chrono::seconds(2) - std::chrono::milliseconds(50));
  }
  for (int fd : slow) send_all(fd, "X-Slow-late: 1\r\n");  // still trickling at the deadline
  for (int fd : slow) {
    auto r = read_response(fd, 3.0);
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.status, 408) << r.body;
    ::close(fd);
  }
  EXPECT_LT(seconds_since(t0), 8.0);
}

TEST(ServerRobustness, OversizedRequestsAreRefusedBeforeTheyAreRead) {
  ServerOptions so;
  so.max_body_bytes = 1 << 20;
  RunningServer s(so);
  // 50 MB announced, nothing sent: 413 at once (and no "100 Continue" when it was asked for).
  for (const std::string expect : {"", "Expect: 100-continue\r\n"}) {
    const int fd = connect_to(s.port);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + expect + "Content-Length: 52428800\r\n\r\n");
    auto r = read_response(fd, 2.0);
    ::close(fd);
    ASSERT_TRUE(r.ok) << expect;
    EXPECT_EQ(r.status, 413);
    EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("at most 1048576 bytes"), std::string::npos);
  }
  auto h = request(s.port, "GET", "/health", "", "X-Big: " + std::string(20000, 'a') + "\r\n");
  EXPECT_EQ(h.status, 431);
  const int fd = connect_to(s.port);
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(read_response(fd, 2.0).status, 411);
  ::close(fd);
  auto bad = request(s.port, "GET", "/health", "", "Content-Length: -5\r\n");
  EXPECT_EQ(bad.status, 400);
  // A prompt too long in bytes for any tokenization to fit the context: refused unread.
  auto big = post(s.port, "/v1/completions", {{"prompt", std::string(900000, 'a')}});
  EXPECT_EQ(big.status, 400);
  EXPECT_EQ(json::parse(big.body)["error"]["param"], "prompt");
}

// One engine, a queue of 0: a second request while one runs gets 429 with Retry-After; the
// running one is cancelled when its client leaves, and the engine serves the next.
TEST(ServerRobustness, FullQueueGets429AndLeavingClientsFreeTheEngine) {
  ServerOptions so;
  so.queue = 0;
  RunningServer s(so);
  const int fd = connect_to(s.port);
  send_all(fd, long_request(true));
  ASSERT_TRUE(wait_first_event(fd, 60));
  auto r = post(s.port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_GE(std::stoi(r.headers.at("retry-after")), 1);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error");
  // While the engine is busy, a request that is bad only in its token count is refused at once.
  const auto t = Clock::now();
  std::string long_prompt;
  for (int i = 0; i < 600; i++) long_prompt += "x = 1\n";
  auto too_long = post(s.port, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 8}});
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_LT(seconds_since(t), 5.0);
  EXPECT_TRUE(stats_of(s.port)["queue"]["busy"].get<bool>());
  ::close(fd);
  const auto t1 = Clock::now();
  HttpResponse ok;
  while (seconds_since(t1) < 20) {
    ok = post(s.port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    if (ok.status != 429) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServerRobustness, NonStreamingRequestIsCancelledWhenTheClientLeaves) {
  RunningServer s;
  const int fd = connect_to(s.port);
  send_all(fd, long_request(false));
  const auto t0 = Clock::now();
  while (!stats_of(s.port)["queue"]["busy"].get<bool>() && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  json last;
  while (seconds_since(t0) < 30) {
    last = stats_of(s.port)["last"];
    if (last.contains("client_gone")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(last.contains("client_gone")) << last.dump();
  EXPECT_TRUE(last["client_gone"].get<bool>());
  EXPECT_LT(last["generated_tokens"].get<int>(), 900);
  EXPECT_EQ(last["stop_reason"], "callback");
}

// Clients that stop reading: each pipelines many requests for the live page and reads none of
// the answers, so its output waits in the server. With as many of them as the connection cap,
// every slot is held by a connection that is not waiting for a request (none can be evicted),
// so a newcomer only gets in once the send deadline has dropped them (a generation for such a
// client stops as when it hangs up: it counts as gone).
TEST(ServerRobustness, ClientsThatStopReadingAreDropped) {
  ServerOptions so;
  so.max_connections = 8;
  so.send_timeout_s = 1.5;
  RunningServer s(so);
  const size_t page_bytes = request(s.port, "GET", "/").body.size();
  ASSERT_GT(page_bytes, 1000u);
  const int n_requests = 4000;  // more answer bytes than the socket buffers on both sides hold
  std::string pipelined;
  for (int i = 0; i < n_requests; i++) pipelined += "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<int> stuck;
  for (int i = 0; i < 8; i++) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, pipelined));
    stuck.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Every slot is held: a new connection is turned away while they are.
  auto early = request(s.port, "GET", "/health", "", "", 0.5);
  EXPECT_FALSE(early.ok && early.status == 200) << "the stalled connections did not fill the cap";
  const auto t0 = Clock::now();
  HttpResponse h;
  while (seconds_since(t0) < 6) {
    h = request(s.port, "GET", "/health", "", "", 0.5);
    if (h.ok && h.status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(h.status, 200) << "/health did not answer once the send deadline had passed";
  // /health gets in as soon as one slot frees; the others reach their deadlines on their own
  // clocks (each fills its socket buffers at its own time, later on a loaded machine). Reading
  // one before its deadline passed would count as progress and keep it, so wait past all of them.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(so.send_timeout_s * 2000) + 1000));
  // The stalled connections were closed: reading one now ends (what the kernel had buffered,
  // then the end) before all its answers arrive.
  const auto t1 = Clock::now();
  for (int fd : stuck) {
    size_t got = 0;
    bool ended = false;
    while (seconds_since(t1) < 30) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        ended = true;
        break;
      }
      got += static_cast<size_t>(n);
    }
    EXPECT_TRUE(ended) << "a connection that read nothing for longer than the send deadline was kept (" << got << " bytes)";
    EXPECT_LT(got, n_requests * page_bytes);
    ::close(fd);
  }
}

TEST(ServerRobustness, KeepAliveAndPipelinedRequests) {
  RunningServer s;
  const int fd = connect_to(s.port);
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  send_all(fd, get + get);  // two at once: both answered, in order, on the one connection
  std::string got;
  const auto t0 = Clock::now();
  auto count = [&] {
    size_t n = 0, at = 0;
    while ((at = got.find("HTTP/1.1 200 OK", at)) != std::string::npos) n++, at++;
    return n;
  };
  while (count() < 2 && seconds_since(t0) < 5) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(count(), 2u) << got;
  EXPECT_NE(got.find("Connection: keep-alive"), std::string::npos);
  send_all(fd, get);
  EXPECT_EQ(read_response(fd, 5).status, 200);
  ::close(fd);
}

TEST(ServerRobustness, ExclusiveBindAndPortErrors) {
  RunningServer a;
  ServerOptions so;
  so.port = a.port;
  try {
    Server b(demo_engine(), so);
    FAIL() << "a second server bound the same port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("taken"), std::string::npos) << e.what();
  }
  // The binary: a taken port is reported before the model loads; 99999 is a usage error.
  const std::string bin = QFLASH_SERVER_BIN;
  auto run = [&](const std::string& args) {
    std::string out;
    FILE* p = popen((bin + " --device cpu " + args + " 2>&1").c_str(), "r");
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    const int status = pclose(p);
    return std::make_pair(WEXITSTATUS(status), out);
  };
  auto [rc1, out1] = run("--port " + std::to_string(a.port));
  EXPECT_EQ(rc1, 1) << out1;
  EXPECT_NE(out1.find("taken"), std::string::npos) << out1;
  EXPECT_EQ(out1.find("target:"), std::string::npos) << "the model was loaded first: " << out1;
  auto [rc2, out2] = run("--port 99999");
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("port: expected an integer in [0, 65535], found 99999"), std::string::npos) << out2;
  auto [rc3, out3] = run("--host 203.0.113.7 --port 0");  // a documentation address, not this machine's
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_NE(out3.find("cannot listen on 203.0.113.7"), std::string::npos) << out3;
}

}  // namespace
}  // namespace qf::test
