// qflash-server: the OpenAI-compatible HTTP server (a separate binary so that `qflash` itself
// needs no HTTP library at run time).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "server/server.h"

int main(int argc, char** argv) {
  CLI::App app{"qflash-server: OpenAI-compatible API for qflash"};
  qf::EngineOptions eo;
  qf::ServerOptions so;
  app.add_option("--model", eo.model_dir, "model folder (default: the demo pair)");
  app.add_option("--draft", eo.draft, "auto | none | mtp | PATH");
  app.add_option("--device", eo.device, "auto | cpu | cuda");
  app.add_option("--max-context", eo.max_context, "positions per request (prompt + completion)");
  app.add_option("--host", so.host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", so.port, "port (default 8080)");
  app.add_option("--model-name", so.model_name, "model id reported to clients");
  CLI11_PARSE(app, argc, argv);
  try {
    auto engine = qf::Engine::create(eo);
    qf::Server server(*engine, so);
    if (!server.listen()) {
      std::fprintf(stderr, "qflash-server: cannot listen on %s:%d\n", so.host.c_str(), so.port);
      return 1;
    }
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash-server: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return 1;
  }
  return 0;
}
