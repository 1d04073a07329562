// qflash chat: an interactive conversation on stdin/stdout. Each turn re-renders the whole
// conversation with the ChatML template and generates the assistant's reply. The engine's
// prefix cache (--prefix-cache-mb) holds the previous turns' prompt states, so a turn whose
// rendering extends the last one resumes there and prefills only what is new (the previous
// reply and the new message, from the last multiple of 64); otherwise it prefills all of it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "runtime/engine.h"

namespace qf::cli {

void add_chat_options(CLI::App* c, ChatArgs& a) {
  add_engine_flags(c, a.engine);
  add_prefix_cache_flag(c, a.engine);
  add_generation_flags(c, a.gen);
  c->add_option("--system", a.system, "system message");
  c->add_flag("--no-think", a.no_think, "thinking off (empty think block)");
  c->add_flag("--stats", a.stats, "print tau and speed after each reply (stderr)");
}

int cmd_chat(const ChatArgs& a) {
  auto engine = Engine::create(a.engine);
  engine->generate_options(a.gen, -1);  // --draft-k and --stop-id against this model: a usage error
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system, ""});
  std::fprintf(stderr, "qflash chat (%s, draft %s). Empty line or Ctrl-D to quit.\n", engine->model_dir().c_str(),
               engine->source() ? engine->source()->name().c_str() : "none");
  std::string line;
  GenerationOptions g = a.gen;
  uint64_t turn = 0;
  while (true) {
    std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    msgs.push_back({"user", line, ""});
    const std::vector<int32_t> ids = chat_encode(engine->tokenizer(), chat_render_pieces(msgs, {true, !a.no_think, {}, {}}));
    g.seed = a.gen.seed + turn++;  // a new draw per turn, reproducible from --seed
    try {
      engine->generate_options(g, static_cast<int64_t>(ids.size()));
    } catch (const Error& e) {
      // Only the length can fail here (the rest was checked above): the conversation outgrew
      // the context; end it (exit 0) rather than fail the session.
      std::fprintf(stderr, "qflash: the conversation is too long: %s\n", e.what());
      break;
    }
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
      std::fprintf(stderr, "[%d tokens, tau %.2f, %.1f tokens/s; prompt %d tokens, %d reused, first token after %.1f ms]\n",
                   st.generated_tokens, st.tau(), st.tokens_per_second(), st.prompt_tokens, st.cached_tokens, st.ttft_ms);
  }
  return 0;
}

}  // namespace qf::cli
