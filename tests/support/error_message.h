// Test helper: the text of the loom::Error a callable throws, or "no error".
#pragma once

#include <string>

#include "loom/core/error.h"

namespace loom::testing_support {

template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace loom::testing_support
