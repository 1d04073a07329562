// qflash chat: an interactive conversation on stdin/stdout. Each turn re-renders the whole
// conversation with the ChatML template and generates the assistant's reply (the prompt is
// prefilled again; prefix reuse across turns is future work, docs/DESIGN.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "runtime/engine.h"

namespace qf::cli {

void add_chat_options(CLI::App* c, ChatArgs& a) {
  c->add_option("--model", a.model, "model folder (default: the demo pair)");
  c->add_option("--draft", a.draft, "auto | none | mtp | PATH");
  c->add_option("--device", a.device, "auto | cpu | cuda");
  c->add_option("--system", a.system, "system message");
  c->add_option("--max-tokens", a.max_tokens, "new tokens per reply");
  c->add_option("--max-context", a.max_context, "positions allocated for the conversation");
  c->add_option("--temperature", a.temperature, "0 = greedy");
  c->add_option("--seed", a.seed, "random seed for sampling");
  c->add_flag("--no-think", a.no_think, "thinking off (empty think block)");
  c->add_flag("--stats", a.stats, "print tau and speed after each reply (stderr)");
}

int cmd_chat(const ChatArgs& a) {
  EngineOptions eo;
  eo.model_dir = a.model;
  eo.draft = a.draft;
  eo.device = a.device;
  eo.max_context = a.max_context;
  auto engine = Engine::create(eo);
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system, ""});
  std::fprintf(stderr, "qflash chat (%s, draft %s). Empty line or Ctrl-D to quit.\n", engine->model_dir().c_str(),
               engine->source() ? engine->source()->name().c_str() : "none");
  std::string line;
  int turn = 0;
  while (true) {
    std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    msgs.push_back({"user", line, ""});
    const std::vector<int32_t> ids = engine->tokenizer().encode(chat_render(msgs, true, !a.no_think));
    if (static_cast<int>(ids.size()) + a.max_tokens > a.max_context) {
      std::fprintf(stderr, "qflash: the conversation (%zu tokens) + --max-tokens exceeds --max-context %d\n", ids.size(),
                   a.max_context);
      break;
    }
    GenerateOptions g;
    g.max_new_tokens = a.max_tokens;
    g.stop_ids = engine->stop_ids();
    g.sampling.temperature = a.temperature;
    g.sampling.seed = a.seed + static_cast<uint64_t>(turn++);
    std::string reply;
    GenStats st = engine->generate_text(ids, g, [&](const std::string& s) {
      reply += s;
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    msgs.push_back({"assistant", reply, ""});
    if (a.stats)
      std::fprintf(stderr, "[%d tokens, tau %.2f, %.1f tokens/s]\n", st.generated_tokens, st.tau(), st.tokens_per_second());
  }
  return 0;
}

}  // namespace qf::cli
