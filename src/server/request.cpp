#include "server/request.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace qf {

using ojson = nlohmann::ordered_json;

namespace {

// A value as shown in an error message: never more than a line of it, cut at a character.
std::string shown(const ojson& v) { return utf8::clip(v.dump(-1, ' ', false, ojson::error_handler_t::replace), 80); }

const ojson* field(const ojson& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// JSON integers only (5.0 and "5" are not); a value outside int64 is reported as sent.
int64_t int_value(const ojson& v, const std::string& name) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail_option(name, expected_range(name), shown(v));
  if (!v.is_number_integer()) fail_option(name, expected_range(name), shown(v));
  return v.get<int64_t>();
}

double number_value(const ojson& v, const std::string& name) {
  if (!v.is_number()) fail_option(name, expected_range(name), shown(v));
  return v.get<double>();
}

bool bool_value(const ojson& v, const std::string& name) {
  if (!v.is_boolean()) fail_option(name, "true or false", shown(v));
  return v.get<bool>();
}

// A message's "content": a string, null, or OpenAI content parts of type "text" (joined by
// newlines, as vLLM does).
std::string content_of(const ojson& msg, const std::string& name) {
  const ojson* c = field(msg, "content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  const char* expected = "a string or an array of {\"type\": \"text\", \"text\": string} parts";
  if (!c->is_array()) fail_option(name, expected, shown(*c));
  std::string out;
  for (size_t j = 0; j < c->size(); j++) {
    const ojson& p = (*c)[j];
    const std::string pn = name + "[" + std::to_string(j) + "]";
    if (!p.is_object() || !p.contains("type") || p["type"] != "text" || !p.contains("text") || !p["text"].is_string())
      fail_option(pn, "{\"type\": \"text\", \"text\": string} (only text parts)", shown(p));
    if (j > 0) out += "\n";
    out += p["text"].get<std::string>();
  }
  return out;
}

std::vector<ChatToolCall> tool_calls_of(const ojson& msg, const std::string& name) {
  std::vector<ChatToolCall> calls;
  const ojson* tc = field(msg, "tool_calls");
  if (!tc) return calls;
  if (!tc->is_array()) fail_option(name, "an array of tool calls", shown(*tc));
  for (size_t j = 0; j < tc->size(); j++) {
    const std::string cn = name + "[" + std::to_string(j) + "]";
    const ojson& c = (*tc)[j];
    const ojson* f = c.is_object() ? field(c, "function") : nullptr;
    if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
      fail_option(cn, "{\"type\": \"function\", \"function\": {\"name\": string, \"arguments\": string}}", shown(c));
    ChatToolCall call{(*f)["name"].get<std::string>(), "{}"};
    if (const ojson* a = field(*f, "arguments")) call.arguments = a->is_string() ? a->get<std::string>() : json_dump_python(*a);
    calls.push_back(std::move(call));
  }
  return calls;
}

void parse_chat(const ojson& body, CompletionRequest& r) {
  const ojson* m = field(body, "messages");
  if (!m || !m->is_array() || m->empty())
    fail_option("messages", "a non-empty array of messages with a string \"role\"", m ? shown(*m) : "nothing");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < m->size(); i++) {
    const ojson& msg = (*m)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      fail_option(name, "an object with a string \"role\"", shown(msg));
    ChatMessage cm{msg["role"].get<std::string>(), content_of(msg, name + ".content"), ""};
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool")
      fail_option(name + ".role", "system, user, assistant or tool", shown(msg["role"]));
    if (const ojson* rc = field(msg, "reasoning_content")) {
      if (!rc->is_string()) fail_option(name + ".reasoning_content", "a string", shown(*rc));
      cm.reasoning = rc->get<std::string>();
    }
    cm.tool_calls = tool_calls_of(msg, name + ".tool_calls");
    msgs.push_back(std::move(cm));
  }
  ChatRenderOptions opt;
  if (const ojson* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) fail_option("chat_template_kwargs", "an object", shown(*k));
    if (const ojson* t = field(*k, "enable_thinking"))
      opt.enable_thinking = bool_value(*t, "chat_template_kwargs.enable_thinking");
  }
  std::vector<std::string> tool_names;
  if (const ojson* t = field(body, "tools")) {
    const char* expected = "an array of {\"type\": \"function\", \"function\": {\"name\": string, ...}}";
    if (!t->is_array()) fail_option("tools", expected, shown(*t));
    for (size_t i = 0; i < t->size(); i++) {
      const ojson& tool = (*t)[i];
      const ojson* f = tool.is_object() ? field(tool, "function") : nullptr;
      if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
          (tool.contains("type") && tool["type"] != "function"))
        fail_option("tools[" + std::to_string(i) + "]", expected, shown(tool));
      tool_names.push_back((*f)["name"].get<std::string>());
      opt.tools.push_back(json_dump_python(tool));
    }
  }
  // tool_choice: "auto" (default with tools), "none" (tools not shown, answer not parsed),
  // "required" or {"type": "function", "function": {"name"}}: the answer starts with the
  // call's opening, written into the prompt (thinking skipped for that turn).
  std::string choice = tool_names.empty() ? "none" : "auto", forced_name;
  if (const ojson* c = field(body, "tool_choice")) {
    const char* expected = "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": string}}";
    if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required") fail_option("tool_choice", expected, shown(*c));
    } else {
      const ojson* f = c->is_object() ? field(*c, "function") : nullptr;
      if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
        fail_option("tool_choice", expected, shown(*c));
      choice = "named";
      forced_name = (*f)["name"].get<std::string>();
      if (std::find(tool_names.begin(), tool_names.end(), forced_name) == tool_names.end())
        fail_option("tool_choice", "the name of a function in \"tools\"", shown((*f)["name"]));
    }
    if (choice != "none" && tool_names.empty()) fail_option("tool_choice", "\"none\" or absent when no tools are given", shown(*c));
  }
  if (choice == "none") opt.tools.clear();
  r.tools = choice != "none";
  if (choice == "required") r.tool_call_prefix = "<tool_call>\n";
  if (choice == "named") r.tool_call_prefix = "<tool_call>\n{\"name\": \"" + forced_name + "\", \"arguments\": ";
  if (!r.tool_call_prefix.empty()) {
    opt.enable_thinking = false;
    opt.answer_prefix = r.tool_call_prefix;
  }
  r.thinking = opt.enable_thinking;
  r.chat = chat_render_pieces(msgs, opt);
}

}  // namespace

CompletionRequest parse_completion_request(const ojson& body, bool chat, int64_t default_max_tokens,
                                           uint64_t default_seed) {
  if (!body.is_object()) fail_option("request body", "a JSON object", shown(body));
  CompletionRequest r;
  if (const ojson* v = field(body, "model")) {
    if (!v->is_string()) fail_option("model", "a string", shown(*v));
    r.model = v->get<std::string>();
  }
  if (chat) {
    parse_chat(body, r);
  } else {
    const ojson* p = field(body, "prompt");
    if (!p || !p->is_string()) fail_option("prompt", "a string", p ? shown(*p) : "nothing");
    r.prompt = p->get<std::string>();
    if (const ojson* v = field(body, "echo"); v && bool_value(*v, "echo"))
      fail_option("echo", "false (echo is not supported)", "true");
  }
  if (const ojson* v = field(body, "n"); v && (!v->is_number_integer() || v->get<int64_t>() != 1))
    fail_option("n", "1 (one choice per request)", shown(*v));
  if (const ojson* v = field(body, "logprobs"); v && !(v->is_boolean() && !v->get<bool>()))
    fail_option("logprobs", "false or absent (log probabilities are not returned)", shown(*v));
  GenerationOptions& g = r.gen;
  g.max_tokens = default_max_tokens;
  for (const char* key : {"max_completion_tokens", "max_tokens"})  // max_tokens wins when both are sent
    if (const ojson* v = field(body, key)) {
      g.max_tokens = int_value(*v, "max_tokens");
      r.max_tokens_given = true;
    }
  if (const ojson* v = field(body, "temperature")) g.temperature = number_value(*v, "temperature");
  if (const ojson* v = field(body, "top_p")) g.top_p = number_value(*v, "top_p");
  if (const ojson* v = field(body, "top_k")) g.top_k = int_value(*v, "top_k");
  g.seed = default_seed;
  if (const ojson* v = field(body, "seed")) {
    // A parsed non-negative integer is "unsigned"; one built in C++ from an int is not.
    const bool ok = v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0);
    if (!ok) fail_option("seed", expected_range("seed"), shown(*v));
    g.seed = v->get<uint64_t>();
  }
  if (const ojson* v = field(body, "stop")) {
    const std::string expected = "a string or an array of at most " + std::to_string(kMaxStopStrings) +
                                 " non-empty strings of at most " + std::to_string(kMaxStopBytes) + " bytes";
    ojson list = v->is_string() ? ojson::array({*v}) : *v;
    if (!list.is_array() || list.size() > kMaxStopStrings) fail_option("stop", expected, shown(*v));
    for (const auto& s : list) {
      if (!s.is_string() || s.get<std::string>().empty() || s.get<std::string>().size() > kMaxStopBytes)
        fail_option("stop", expected, shown(*v));
      r.stop.push_back(s.get<std::string>());
    }
  }
  if (const ojson* v = field(body, "draft_k"))  // "auto" is the default
    if (!(v->is_string() && v->get<std::string>() == "auto")) g.draft_k = int_value(*v, "draft_k");
  if (const ojson* v = field(body, "ignore_eos")) g.ignore_eos = bool_value(*v, "ignore_eos");
  if (const ojson* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) fail_option("stop_ids", expected_range("stop_ids"), shown(*v));
    for (const auto& id : *v) g.stop_ids.push_back(int_value(id, "stop_ids"));
  }
  if (const ojson* v = field(body, "stream")) r.stream = bool_value(*v, "stream");
  validate_generation_options(g);
  return r;
}

CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat, int64_t default_max_tokens,
                                           uint64_t default_seed) {
  return parse_completion_request(ojson::parse(body.dump()), chat, default_max_tokens, default_seed);
}

int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') depth--;
  }
  return deepest;
}

namespace {

void dump_python(const ojson& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += ojson(it.key()).dump();
      out += ": ";
      dump_python(it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); i++) {
      if (i) out += ", ";
      dump_python(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump();  // strings: non-ASCII kept, control characters escaped, as Python's ensure_ascii=False
  }
}

}  // namespace

std::string json_dump_python(const ojson& v) {
  std::string s;
  dump_python(v, s);
  return s;
}

std::string param_of_message(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; i++)
    if (message[i] == ' ') return "";
  return message.substr(0, colon);
}

}  // namespace qf
