#include "loom/core/status_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"

namespace loom {

namespace {

bool write_all(int fd, const std::string& s) {
  for (size_t done = 0; done < s.size();) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Writes `text` to `path` whole: a reader sees the old file or the new one.
void put_file(const std::string& path, const std::string& text) {
  const std::string next = path + ".next";
  {
    std::ofstream f(next, std::ios::trunc);
    f << text << "\n";
  }
  ::rename(next.c_str(), path.c_str());
}

// Connects to "IP:PORT" within `timeout_ms`; -1 when it does not answer.
int connect_to(const std::string& addr, int timeout_ms) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(std::atoi(addr.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof err;
  if (::poll(&p, 1, timeout_ms) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

StatusServer::StatusServer(std::string status_dir, int nproc, std::string token)
    : dir_(std::move(status_dir)), token_(std::move(token)), hosts_(size_t(nproc)), fds_(size_t(nproc), -1),
      lost_(size_t(nproc), 0), exited_(size_t(nproc), 0) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(listen_fd_, 64) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
      ::pipe2(wake_, O_CLOEXEC) != 0)
    throw Error(std::string("--hosts: the supervisor cannot listen for its ranks' status: ") + std::strerror(errno));
  port_ = ntohs(sa.sin_port);
  thread_ = std::thread([this] { serve(); });
}

StatusServer::~StatusServer() {
  stop_ = true;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) ::close(fd);
}

std::string StatusServer::addresses() const {
  std::string out, loopback;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) == 0) {
    for (ifaddrs* a = all; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      char ip[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, ip, sizeof ip);
      const std::string item = std::string(ip) + ":" + std::to_string(port_);
      if (std::string(ip).rfind("127.", 0) == 0) loopback += "," + item;
      else out += (out.empty() ? "" : ",") + item;
    }
    ::freeifaddrs(all);
  }
  if (loopback.empty()) loopback = ",127.0.0.1:" + std::to_string(port_);
  return out.empty() ? loopback.substr(1) : out + loopback;
}

std::string StatusServer::host_of(int r) const {
  std::lock_guard<std::mutex> lock(mu_);
  return r >= 0 && size_t(r) < hosts_.size() ? hosts_[size_t(r)] : "";
}

bool StatusServer::lost(int r) const {
  std::lock_guard<std::mutex> lock(mu_);
  return r >= 0 && size_t(r) < lost_.size() && lost_[size_t(r)];
}

bool StatusServer::send(int r, const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  return r >= 0 && size_t(r) < fds_.size() && fds_[size_t(r)] >= 0 && write_all(fds_[size_t(r)], line + "\n");
}

void StatusServer::on_line(Peer& p, const std::string& line) {
  std::istringstream in(line);
  std::string verb;
  in >> verb;
  if (p.rank < 0) {  // the first line must be a valid hello
    int rank = -1;
    long pid = 0;
    std::string host, token;
    if (verb != "hello" || !(in >> rank >> pid >> host >> token) || token != token_ || rank < 0 ||
        size_t(rank) >= fds_.size())
      return close_peer(p);
    std::lock_guard<std::mutex> lock(mu_);
    p.rank = rank, hosts_[size_t(rank)] = host, fds_[size_t(rank)] = p.fd;
    return;
  }
  const std::string rest = line.size() > verb.size() ? line.substr(verb.size() + 1) : "";
  const std::string r = std::to_string(p.rank);
  if (verb == "beat") put_file(dir_ + "/beat-" + r, rest);
  if (verb == "exit") {
    put_file(dir_ + "/rank-" + r, rest);
    std::lock_guard<std::mutex> lock(mu_);
    exited_[size_t(p.rank)] = 1;
  }
}

void StatusServer::close_peer(Peer& p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (p.rank >= 0) {
    fds_[size_t(p.rank)] = -1;
    if (!exited_[size_t(p.rank)]) lost_[size_t(p.rank)] = 1;
  }
  ::close(p.fd);
  p.fd = -1;
}

void StatusServer::serve() {
  std::vector<Peer> peers;
  while (!stop_) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    for (const Peer& p : peers) fds.push_back({p.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 500) <= 0) continue;
    if (fds[0].revents & POLLIN)
      if (const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC); fd >= 0) peers.push_back({fd, -1, ""});
    for (size_t i = 2; i < fds.size(); ++i) {
      Peer& p = peers[i - 2];
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(p.fd, buf, sizeof buf);
      if (n <= 0) {
        close_peer(p);
        continue;
      }
      p.pending.append(buf, size_t(n));
      for (size_t nl; p.fd >= 0 && (nl = p.pending.find('\n')) != std::string::npos;) {
        const std::string line = p.pending.substr(0, nl);
        p.pending.erase(0, nl + 1);
        on_line(p, line);
      }
      if (p.fd >= 0 && p.pending.size() > 65536) close_peer(p);  // not a rank of ours
    }
    std::erase_if(peers, [](const Peer& p) { return p.fd < 0; });
  }
  for (Peer& p : peers) ::close(p.fd);
}

StatusLink::StatusLink(const std::string& addresses, int rank, const std::string& host, const std::string& token) {
  std::stringstream items(addresses);
  for (std::string a; fd_ < 0 && std::getline(items, a, ',');) fd_ = connect_to(a, 2000);
  if (fd_ < 0)
    throw Error("rank " + std::to_string(rank) + " on host " + host + " cannot reach its supervisor at any of " +
                addresses + " (Note [Status over TCP]): let the hosts reach the supervisor's host over TCP");
  send("hello " + std::to_string(rank) + " " + std::to_string(::getpid()) + " " + host + " " + token);
}

StatusLink::~StatusLink() {
  if (fd_ >= 0) ::close(fd_);
}

bool StatusLink::send(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  return fd_ >= 0 && write_all(fd_, line + "\n");
}

bool StatusLink::wait_for_kill(std::atomic<bool>* stop) {
  std::string pending;
  char buf[256];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending.append(buf, size_t(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      const std::string line = pending.substr(0, nl);
      if (line == "kill") return true;
      if (line == "stop" && stop) *stop = true;
    }
    if (pending.size() > 4096) pending.clear();
  }
}

}  // namespace loom
