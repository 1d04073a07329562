// OpenAI-compatible HTTP API over one Engine (docs/SERVER.md). Endpoints: GET /health,
// GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both with "stream": true as
// server-sent events), GET /v1/stats (the last request's telemetry and the queue) and GET / (a
// live page that streams a generation and shows how each token was produced).
//
// Threads: the HTTP thread (all sockets, server/http.h), a pool that parses and tokenizes
// requests, and one engine thread fed by a bounded queue (server/workers.h). A request that
// finds the queue full gets 429 with Retry-After.
#pragma once
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "server/workers.h"

namespace qf {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0 = pick a free port (tests)
  std::string model_name;    // the id reported by /v1/models (default: the folder name)
  int default_max_tokens = 256;
  int queue = 8;             // requests that may wait behind the running one
  int workers = 2;           // threads that parse and tokenize requests
  int64_t max_body_bytes = int64_t(16) << 20;
  double request_timeout_s = 10;  // a whole request (headers and body) must arrive within this
  double idle_timeout_s = 30;     // a kept-alive connection with no request is closed after this
  double send_timeout_s = 30;     // a client that reads none of its answer for this long is gone
  int max_connections = 256;
};

class Server {
 public:
  // Binds (exclusively) at once: throws qf::Error naming the address when it cannot.
  // `generate_fn` is for tests only (a scripted token source in place of Engine::generate, see
  // EngineQueue); qflash-server never sets it. The engine still tokenizes, bounds and decodes.
  Server(Engine& engine, const ServerOptions& opt, GenerateFn generate_fn = nullptr);
  ~Server();
  int port() const;
  void run();               // serves until stop()
  int start_background();   // serves in a thread; returns the port
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The live page served at "/".
const char* live_page_html();

}  // namespace qf
