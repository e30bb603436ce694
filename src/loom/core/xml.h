// Text inside SVG / XML that loom writes (names from configs, files and runs).
#pragma once

#include <string>

namespace loom {

inline std::string xml_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace loom
