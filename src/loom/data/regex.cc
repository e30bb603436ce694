#include "loom/data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "loom/core/error.h"

namespace loom::data {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match data and JIT stack: pcre2_match is reentrant given its own of each.
struct ThreadScratch {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  ThreadScratch() {
    md = pcre2_match_data_create(4, nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    LOOM_ASSERT(md && stack && ctx);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadScratch() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};

ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(const std::string& pattern, bool literal) : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE at = 0;
  const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &at, nullptr);
  if (!impl_->code)
    throw Error("pre-tokenizer pattern '" + pattern + "' does not compile at offset " + std::to_string(at) + ": " +
                pcre2_message(err));
  // JIT is an optimisation; the interpreter gives the same matches where it is unavailable.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() = default;

void SplitRegex::split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces) const {
  LOOM_CHECK(text.size() < (size_t(1) << 32), "text of ", text.size(), " bytes is too long to pre-tokenize at once");
  ThreadScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap = 0;  // gap: start of text not yet covered by a piece
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw Error("pre-tokenizer pattern '" + pattern_ + "' failed at byte " + std::to_string(pos) + ": " +
                  pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    const size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match splits nothing: step over one UTF-8 character
      pos = b + 1;
      while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) pos++;
      continue;
    }
    if (b > gap) pieces.emplace_back(uint32_t(gap), uint32_t(b - gap));
    pieces.emplace_back(uint32_t(b), uint32_t(e - b));
    pos = gap = e;
  }
  if (gap < text.size()) pieces.emplace_back(uint32_t(gap), uint32_t(text.size() - gap));
}

}  // namespace loom::data
