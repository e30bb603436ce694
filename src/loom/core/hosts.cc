#include "loom/core/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"

namespace loom {

namespace {

// A host name or address as mpirun and ssh take it: letters, digits, '.', '-', '_'.
bool valid_host(const std::string& h) {
  return !h.empty() && std::all_of(h.begin(), h.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '-' || c == '_';
  });
}

// A positive slot count from `text`, or 0.
int slot_count(const std::string& text) {
  if (text.empty() || text.size() > 6 || !std::all_of(text.begin(), text.end(), ::isdigit)) return 0;
  return std::stoi(text);
}

void add_host(std::vector<HostSlots>& out, HostSlots h, const std::string& where) {
  if (!valid_host(h.host))
    throw ConfigError("--hosts: " + where + ": '" + h.host + "' is not a host name (letters, digits, '.', '-', '_')");
  if (h.slots <= 0) throw ConfigError("--hosts: " + where + ": host " + h.host + " needs a positive slot count");
  for (const HostSlots& o : out)
    if (o.host == h.host)
      throw ConfigError("--hosts: " + where + ": host " + h.host + " is listed twice; give it once with all its slots");
  out.push_back(std::move(h));
}

std::vector<HostSlots> parse_inline(const std::string& spec) {
  std::vector<HostSlots> out;
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t colon = item.find(':');
    HostSlots h{item.substr(0, colon), 1};
    if (colon != std::string::npos) h.slots = slot_count(item.substr(colon + 1));
    add_host(out, h, "item '" + item + "' (expected HOST or HOST:SLOTS)");
  }
  if (out.empty()) throw ConfigError("--hosts: '" + spec + "' names no host; give a hostfile or HOST:SLOTS,...");
  return out;
}

}  // namespace

std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& origin) {
  std::vector<HostSlots> out;
  std::stringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    line = line.substr(0, line.find('#'));
    std::stringstream words(line);
    HostSlots h;
    if (!(words >> h.host)) continue;
    const std::string where = origin + " line " + std::to_string(n);
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) == 0) h.slots = slot_count(w.substr(6));
      else if (w.rfind("max_slots=", 0) == 0 || w.rfind("max-slots=", 0) == 0) continue;
      else throw ConfigError("--hosts: " + where + ": '" + w + "' is not understood (expected HOST slots=N)");
    }
    add_host(out, h, where);
  }
  if (out.empty()) throw ConfigError("--hosts: " + origin + " names no host (expected lines HOST slots=N)");
  return out;
}

std::vector<HostSlots> parse_hosts(const std::string& spec) {
  if (std::ifstream f(spec); f) {
    std::stringstream text;
    text << f.rdbuf();
    return parse_hostfile_text(text.str(), spec);
  }
  if (spec.find('/') != std::string::npos)
    throw ConfigError("--hosts: no hostfile '" + spec + "' (a file of lines HOST slots=N, or inline HOST:SLOTS,...)");
  return parse_inline(spec);
}

int total_slots(const std::vector<HostSlots>& hosts) {
  int n = 0;
  for (const HostSlots& h : hosts) n += h.slots;
  return n;
}

std::string host_arg(const std::vector<HostSlots>& hosts) {
  std::string s;
  for (const HostSlots& h : hosts) s += (s.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  return s;
}

std::string this_host() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && name[0] ? name : "localhost";
}

std::vector<std::string> host_of_ranks(const std::vector<HostSlots>& hosts) {
  std::vector<std::string> out;
  for (const HostSlots& h : hosts) out.insert(out.end(), size_t(h.slots), h.host);
  return out;
}

}  // namespace loom
