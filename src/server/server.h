// OpenAI-compatible HTTP API over one Engine (requests are served one at a time: the engine
// holds one sequence state). Endpoints: GET /health, GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions (both with "stream": true as server-sent events), GET /v1/stats
// (the last request's telemetry) and GET / (a live page that polls /v1/stats).
#pragma once
#include <memory>
#include <string>

#include "runtime/engine.h"

namespace qf {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0 = pick a free port (tests)
  std::string model_name;   // the id reported by /v1/models (default: the folder name)
  int default_max_tokens = 256;
};

class Server {
 public:
  Server(Engine& engine, const ServerOptions& opt);
  ~Server();
  // Binds and serves until stop(); returns false when the address cannot be bound.
  bool listen();
  // Binds to a free port on `host` (returned) and serves in a background thread.
  int start_background();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qf
