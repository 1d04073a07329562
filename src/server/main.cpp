// qflash-server: the OpenAI-compatible HTTP server (docs/SERVER.md). Exit status: 0, 1 (error),
// 2 (usage error), like qflash.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "server/http.h"
#include "server/server.h"

namespace {

qf::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

void check_range(const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    qf::fail_option(name, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", std::to_string(v));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qflash-server: OpenAI-compatible API for qflash"};
  qf::EngineOptions eo;
  qf::ServerOptions so;
  int64_t port = so.port, queue = so.queue, workers = so.workers, max_body_mb = so.max_body_bytes >> 20,
          max_tokens = so.default_max_tokens, max_conn = so.max_connections;
  double timeout = so.request_timeout_s, send_timeout = so.send_timeout_s;
  qf::cli::add_engine_flags(&app, eo);
  qf::cli::add_prefix_cache_flag(&app, eo);
  app.add_option("--host", so.host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", port, "port (default 8080; 0 picks a free one)");
  app.add_option("--model-name", so.model_name, "model id reported to clients (default: the folder name)");
  app.add_option("--queue", queue, "requests that may wait for the engine; more get 429 (default 8)");
  app.add_option("--workers", workers, "threads that parse and tokenize requests (default 2)");
  app.add_option("--max-body-mb", max_body_mb, "largest request body in MiB; larger gets 413 (default 16)");
  app.add_option("--request-timeout", timeout, "seconds a whole request may take to arrive; then 408 (default 10)");
  app.add_option("--send-timeout", send_timeout, "seconds a client may read none of its answer; then it is dropped (default 30)");
  app.add_option("--max-connections", max_conn, "open connections; past it the longest-waiting idle one is closed (default 256)");
  app.add_option("--default-max-tokens", max_tokens, "max_tokens when a request gives none (default 256, or what fits)");
  try {
    app.parse(argc, argv);
    check_range("port", port, 0, 65535);
    check_range("queue", queue, 0, 4096);
    check_range("workers", workers, 1, 64);
    check_range("max_body_mb", max_body_mb, 1, 4096);
    check_range("max_connections", max_conn, 8, 65536);
    check_range("default_max_tokens", max_tokens, 1, qf::kMaxContextLimit);
    if (!(timeout >= 0.1 && timeout <= 3600))
      qf::fail_option("request_timeout", "a number of seconds in [0.1, 3600]", qf::strf("%g", timeout));
    so.port = static_cast<int>(port);
    so.queue = static_cast<int>(queue);
    so.workers = static_cast<int>(workers);
    so.max_body_bytes = max_body_mb << 20;
    so.max_connections = static_cast<int>(max_conn);
    so.default_max_tokens = static_cast<int>(max_tokens);
    so.request_timeout_s = timeout;
    if (!(send_timeout >= 0.1 && send_timeout <= 3600))
      qf::fail_option("send_timeout", "a number of seconds in [0.1, 3600]", qf::strf("%g", send_timeout));
    so.send_timeout_s = send_timeout;
    qf::validate_engine_options(eo);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "qflash-server: error (usage): %s\nRun 'qflash-server --help' for the options.\n", e.what());
    return 2;
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash-server: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return 2;
  }
  try {
    qf::http::check_bindable(so.host, so.port);  // before a load that may take minutes
    auto engine = qf::Engine::create(eo);
    const double warm_ms = engine->warm_up();  // before listening: no request records graphs
    if (warm_ms > 0) std::fprintf(stderr, "qflash-server: round shapes recorded in %.0f ms\n", warm_ms);
    qf::Server server(*engine, so);
    g_server = &server;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    server.run();
    g_server = nullptr;
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash-server: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return e.kind() == qf::ErrorKind::Usage ? 2 : 1;
  }
  return 0;
}
