// The demo pair on the CPU, loaded once per test binary, and servers over it on free loopback
// ports with the options a test needs.
#pragma once
#include <gtest/gtest.h>

#include <memory>

#include "runtime/engine.h"
#include "server/server.h"
#include "server/workers.h"
#include "tests/server/http_client.h"

namespace qf::test {

inline std::unique_ptr<Engine> load_demo(int64_t max_context) {
  EngineOptions eo;
  eo.device = "cpu";
  eo.max_context = max_context;
  return Engine::create(eo);
}

inline Engine& demo_engine() {
  static std::unique_ptr<Engine> e = load_demo(1024);
  return *e;
}

// A context of 96 positions: a short prompt can fill it.
inline Engine& small_engine() {
  static std::unique_ptr<Engine> e = load_demo(96);
  return *e;
}

struct RunningServer {
  std::unique_ptr<Server> server;
  int port = 0;
  // `generate_fn`: a scripted token source in place of the engine (scripted_generation.h).
  explicit RunningServer(ServerOptions so = {}, Engine& engine = demo_engine(), GenerateFn generate_fn = nullptr) {
    so.port = 0;
    if (so.model_name.empty()) so.model_name = "demo";
    server = std::make_unique<Server>(engine, so, std::move(generate_fn));
    port = server->start_background();
  }
};

// The engine's own greedy text for a prompt, token by token: what the server must send.
inline std::vector<std::string> engine_pieces(const std::vector<int32_t>& ids, int n, bool ignore_eos = false) {
  Engine& e = demo_engine();
  GenerateOptions g;
  g.max_new_tokens = n;
  if (!ignore_eos) g.stop_ids = e.stop_ids();
  StreamDecoder dec(e.tokenizer());
  std::vector<std::string> out;
  e.generate(ids, g, [&](int32_t t) {
    out.push_back(dec.push(t));
    return true;
  });
  const std::string tail = dec.flush();
  if (!tail.empty()) out.push_back(tail);
  return out;
}

inline std::string engine_text(const std::string& prompt, int n, bool ignore_eos = false) {
  std::string s;
  for (const std::string& p : engine_pieces(demo_engine().tokenizer().encode(prompt), n, ignore_eos)) s += p;
  return s;
}

}  // namespace qf::test
