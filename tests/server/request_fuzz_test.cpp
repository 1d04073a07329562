// Fuzz-style robustness of what a client sends the server: request bodies (valid completion and
// chat requests, the chat_tools fixture's requests with tools and tool calls) mutated by a seeded
// generator, then taken through the server's own steps (json_depth, parse_completion_request,
// chat_encode). Each mutant must either be accepted or refused with a qf::Error of kind Usage whose
// message names a request parameter: never a crash, another exception type (the server answers
// those with 500, not 400) or an error without the parameter's name.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "server/request.h"
#include "tests/server/http_client.h"
#include "tests/support/json_mutator.h"
#include "tests/server/server_fixture.h"

namespace qf::test {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ojson> seeds() {
  std::vector<ojson> s;
  s.push_back(ojson::parse(R"({"prompt": "def f(x):", "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 20,
                              "seed": 3, "stop": ["\n\n", "return"], "stream": true, "draft_k": "auto"})"));
  s.push_back(ojson::parse(R"({"messages": [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                            {"role": "assistant", "content": "hello"},
                                            {"role": "user", "content": "again"}],
                              "max_completion_tokens": 4, "stop": "x", "n": 1, "ignore_eos": false,
                              "stop_token_ids": [1, 2], "chat_template_kwargs": {"enable_thinking": false}})"));
  std::ifstream f(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/tokenizer/chat_tools.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const ojson fx = ojson::parse(ss.str());
  for (const auto& c : fx["cases"]) s.push_back(c["request"]);
  return s;
}

// The mutator's vocabulary: template markers, roles and odd UTF-8 among the strings; the fields
// of messages, tools and tool calls among the keys; every request field at the top.
JsonMutator request_mutator() {
  JsonMutator m;
  m.strings = {"", "auto", "none", "required", "user", "assistant", "tool", "system", "function", "text", "image_url",
               "<|im_start|>", "<|im_end|>\n<|im_start|>system\n", "<tool_call>", "</tool_call>", "<think>", "\xc3\xa9",
               "\xf0\x9f\x98\x80", std::string(300, 'a'), "{\"a\": 1}", "-1", "1e400", "null", "\n\n"};
  m.keys = {"role", "content", "type", "text", "name", "arguments", "tool_calls", "function", "id", "tool_call_id",
            "parameters", "x"};
  m.top = {"prompt", "messages", "tools", "tool_choice", "model", "max_tokens", "max_completion_tokens", "temperature",
           "top_p", "top_k", "seed", "stop", "n", "stream", "draft_k", "ignore_eos", "stop_token_ids",
           "chat_template_kwargs", "logprobs", "response_format"};
  return m;
}

// The server's steps for one body; "" when accepted or refused properly, else what went wrong.
std::string take(const ojson& body, bool chat, const Tokenizer& tok) {
  const std::string text = body.dump();
  try {
    if (json_depth(text) > kMaxJsonDepth) return "";  // refused before parsing (tested in server_test)
    const ojson parsed = ojson::parse(text);
    const CompletionRequest r = parse_completion_request(parsed, chat, 16, 0);
    if (chat) (void)chat_encode(tok, r.chat);
    else (void)tok.encode(r.prompt);
    return "";
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Usage) return std::string("a non-usage qf::Error: ") + e.what();
    const std::string msg = e.what();
    // The body as a whole ("request body: expected a JSON object, ...") or one parameter.
    if (msg.rfind("request body: ", 0) != 0 && param_of_message(msg).empty())
      return "an error that names no parameter: " + msg;
    return "";
  } catch (const std::exception& e) {
    return std::string("a ") + typeid(e).name() + " (the server would answer 500): " + e.what();
  }
}

TEST(ServerRequestFuzz, MutatedBodiesAreAcceptedOrRefusedNamingTheParameter) {
  const Tokenizer& tok = demo_engine().tokenizer();
  const std::vector<ojson> base = seeds();
  ASSERT_GE(base.size(), 8u);
  const JsonMutator mut = request_mutator();
  std::mt19937_64 rng(20261204);
  int refused = 0, accepted = 0, bad = 0;
  for (int i = 0; i < 20000; i++) {
    const ojson& s = base[static_cast<size_t>(i) % base.size()];
    const bool chat = s.contains("messages");
    const ojson m = mut.mutate(s, rng);
    const std::string err = take(m, chat, tok);
    if (!err.empty()) {
      if (++bad <= 8) ADD_FAILURE() << (chat ? "chat" : "completion") << " body " << m.dump() << "\n  gave " << err;
      continue;
    }
    try {
      (void)parse_completion_request(ojson::parse(m.dump()), chat, 16, 0);
      accepted++;
    } catch (const Error&) {
      refused++;
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of 20000 mutants were not handled as a client error";
  // Both outcomes must occur, or the mutator is not reaching the validators.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

// Raw HTTP: valid requests with bytes flipped, inserted, deleted or cut, header lines duplicated or
// garbled, Content-Length replaced, each on its own connection. The server must answer with a
// client status (never 5xx but 505 for a bad HTTP version; 408 for a request cut short, at its
// deadline) and a JSON error body, or close the connection; and stay up for the next client.
TEST(ServerRequestFuzz, MutatedRawRequestsGetAClientErrorOrAClose) {
  ServerOptions so;
  so.request_timeout_s = 1;
  so.idle_timeout_s = 1;  // a connection that sends nothing (a mutant cut to zero bytes) is closed
  so.queue = 2;
  RunningServer srv(so, small_engine());
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  const std::string chat = R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 1})";
  auto post_req = [](const std::string& path, const std::string& b) {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(b.size()) + "\r\n\r\n" + b;
  };
  const std::vector<std::string> base = {"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                                         "GET /v1/models HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
                                         post_req("/v1/completions", body), post_req("/v1/chat/completions", chat)};
  std::mt19937_64 rng(4122026);
  auto rnd = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const std::vector<std::string> junk = {"\r\n", "\r\n\r\n", ":", " ", "\0", "\xff\xfe", "%00", "%zz", "\t",
                                         "Content-Length: 5\r\n", "Content-Length: -1\r\n",
                                         "Content-Length: 99999999999999999999\r\n", "Transfer-Encoding: chunked\r\n",
                                         "Expect: 100-continue\r\n", "Host: a\r\n", std::string(300, 'A'), "\xc3\x28"};
  int answered = 0, closed = 0, bad = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto shown = [](const std::string& r) {  // the raw bytes, printable
    return nlohmann::json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  auto mutant = [&]() {
    std::string r = base[rnd(base.size())];
    for (int k = 1 + static_cast<int>(rnd(3)); k > 0; k--) {
      switch (rnd(5)) {
        case 0: r[rnd(r.size())] = static_cast<char>(rng()); break;
        case 1: r.insert(rnd(r.size() + 1), junk[rnd(junk.size())]); break;
        case 2: {
          const size_t a = rnd(r.size()), n = 1 + rnd(8);
          r.erase(a, n);
          break;
        }
        case 3: r.resize(rnd(r.size() + 1)); break;
        default: {
          const size_t at = r.find("Content-Length: ");
          if (at != std::string::npos) {
            const size_t e = r.find("\r\n", at);
            static const std::vector<std::string> lens = {"0", "1", "7", "1000", "-3", "+4", "0x10", "", "4 4", "18446744073709551616"};
            r.replace(at + 16, e == std::string::npos ? std::string::npos : e - at - 16, lens[rnd(lens.size())]);
          }
        }
      }
    }
    return r;
  };
  // In batches of 64 connections at once, so that the requests cut short wait out their deadline
  // (request_timeout_s) together; then each is read.
  for (int batch = 0; batch < 6; batch++) {
    std::vector<std::pair<int, std::string>> conns;
    for (int i = 0; i < 64; i++) {
      const std::string r = mutant();
      const int fd = connect_to(srv.port);
      ASSERT_GE(fd, 0) << "the server stopped accepting connections (batch " << batch << ")";
      send_all(fd, r);
      conns.emplace_back(fd, r);
    }
    for (auto& [fd, r] : conns) {
      HttpResponse resp;
      try {
        resp = read_response(fd, 20);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "an unreadable response to " << shown(r) << ": " << e.what();
      }
      ::close(fd);
      if (resp.status == 0) {
        closed++;
        continue;
      }
      answered++;
      // 505 (HTTP Version Not Supported) is the client's version, not a server failure.
      const bool client = (resp.status >= 200 && resp.status < 500) || resp.status == 505;
      bool json_ok = resp.status < 400;
      if (!json_ok) {
        const auto j = nlohmann::json::parse(resp.body, nullptr, false);
        json_ok = !j.is_discarded() && j.contains("error");
      }
      if ((!client || !json_ok) && ++bad <= 8)
        ADD_FAILURE() << "request " << shown(r) << "\n  got " << resp.status << " " << resp.body.substr(0, 200);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(answered, 250) << "closed " << closed;
  const HttpResponse h = request(srv.port, "GET", "/health");
  EXPECT_EQ(h.status, 200) << "the server is not healthy after the mutants";
  std::printf("raw mutants: %d answered, %d closed without an answer, %.1f s\n", answered, closed, secs);
}

}  // namespace
}  // namespace qf::test
