#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qf {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string& bytes = tok_->token_bytes(id);  // throws on an out-of-range id
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t n = utf8::sequence_len(pending_, i);
    if (n > 0) {
      out.append(pending_, i, n);
      i += n;
    } else if (utf8::is_incomplete_prefix(pending_, i)) {
      break;  // a later token may complete this character
    } else {
      // Can never become valid: render now so one bad byte does not stall the stream.
      out.append(utf8::kReplacement);
      i += utf8::invalid_subpart_len(pending_, i);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace qf
