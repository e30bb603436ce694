// Shared by the config reader and its checks (config.cc, config_check.cc); not public.
#pragma once

#include <string>
#include <vector>

namespace loom {

// A double as TOML writes it (17 digits, always with a '.', 'e' or "inf").
std::string fmt_double(double x);
// Throws ConfigError listing every problem (one problem: on one line).
[[noreturn]] void throw_config_errors(const std::vector<std::string>& errs);

}  // namespace loom
