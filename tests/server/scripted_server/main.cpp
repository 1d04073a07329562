// qflash_server_scripted: TEST-ONLY. The real Server over the demo pair's tokenizer and limits,
// but every generation replays a scripted model answer (tests/server/scripted_generation.h)
// instead of running the model, so that the Python client tests see tool calls the demo pair
// never writes. Built only with the tests, never installed; qflash-server has no such mode.
//   qflash_server_scripted --script FILE.json [--device cpu] [--port N] [--model-name NAME]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "server/server.h"
#include "tests/server/scripted_generation.h"

namespace {
qf::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}
}  // namespace

int main(int argc, char** argv) {
  qf::EngineOptions eo;
  eo.device = "cpu";
  qf::ServerOptions so;
  std::string script_path;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "qflash_server_scripted: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--script") script_path = v;
    else if (a == "--device") eo.device = v;
    else if (a == "--port") so.port = std::atoi(v.c_str());
    else if (a == "--model-name") so.model_name = v;
    else {
      std::fprintf(stderr, "qflash_server_scripted: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (script_path.empty()) {
    std::fprintf(stderr, "qflash_server_scripted: --script FILE.json is required\n");
    return 2;
  }
  try {
    const auto pieces = qf::test::read_script_file(script_path)["pieces"].get<std::vector<std::string>>();
    auto engine = qf::Engine::create(eo);
    const qf::test::Script script = qf::test::make_script(engine->tokenizer(), pieces);
    qf::Server server(*engine, so, qf::test::scripted_generation(script, engine->limits().max_context));
    g_server = &server;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    server.run();
    g_server = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_server_scripted: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
