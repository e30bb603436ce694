// A supervised job's ranks on other hosts report to the supervisor over TCP (Note [Status over
// TCP]); the supervisor side writes what they say into its status directory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom {

// Note [Status over TCP]
// `loom train --nproc N` supervises its ranks through files in a status directory and their
// pids (Note [Supervised launch]); a rank on another host (`--hosts`) can reach neither. So a
// rank whose host is not the supervisor's reports over one TCP connection instead: it tries the
// supervisor's addresses (LOOM_SUPERVISOR_ADDR, "IP:PORT,IP:PORT": every IPv4 address the
// supervisor's host has) in order and sends "hello RANK PID HOST TOKEN" (TOKEN: a random
// LOOM_SUPERVISOR_TOKEN, so no other process can speak for a rank), then its heartbeat
// "beat SEQ CPU_MS WAITS STEP" once a second and "exit CODE" as it leaves. The supervisor
// writes them into its status directory as the files a local rank writes (beat-R, rank-R; no
// pid-R, a remote pid means nothing here), so every check of the Note runs the same for every
// rank, and it knows each rank's host, so messages name it. A connection that closes without
// "exit" is a rank gone (killed, or its host lost: a host that vanishes without closing its
// connections is found by its silent heartbeat instead). To end a remote rank the supervisor
// sends "kill": the rank's reader thread SIGKILLs its own process (a stopped one cannot, and
// dies when mpirun's daemon on its host is killed with the job). A rank whose connection closes
// (the supervisor gone) ends itself, as a local rank does when the supervisor's pid is gone.

// The supervisor's side: a listening socket and a thread that serves the connections.
class StatusServer {
 public:
  // Listens on every address; `status_dir` receives beat-R and rank-R for the ranks it hears.
  StatusServer(std::string status_dir, int nproc, std::string token);
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // "IP:PORT,..." for LOOM_SUPERVISOR_ADDR: this host's IPv4 addresses, loopback last.
  std::string addresses() const;
  // The host rank `r` said hello from ("" until it has).
  std::string host_of(int r) const;
  // Rank `r` connected and its connection closed without "exit".
  bool lost(int r) const;
  // Sends "kill" (or `line`) to rank `r`; false if it has no open connection.
  bool kill(int r) { return send(r, "kill"); }
  bool send(int r, const std::string& line);

 private:
  struct Peer {
    int fd = -1, rank = -1;
    std::string pending;
  };
  void serve();
  void on_line(Peer& p, const std::string& line);
  void close_peer(Peer& p);

  std::string dir_, token_;
  int listen_fd_ = -1, port_ = 0, wake_[2] = {-1, -1};
  mutable std::mutex mu_;
  std::vector<std::string> hosts_;  // per rank
  std::vector<int> fds_;            // per rank: its open connection, or -1
  std::vector<char> lost_, exited_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A rank's side: one connection to the supervisor.
class StatusLink {
 public:
  // Connects to the first of `addresses` ("IP:PORT,...") that answers within 2 s each and says
  // hello; throws Error naming every address tried when none does.
  StatusLink(const std::string& addresses, int rank, const std::string& host, const std::string& token);
  ~StatusLink();
  StatusLink(const StatusLink&) = delete;
  StatusLink& operator=(const StatusLink&) = delete;

  // Sends one line (a '\n' is added); false once the connection is gone.
  bool send(const std::string& line);
  // Blocks until the supervisor says "kill" (returns true) or the connection closes (false);
  // sets `*stop` when it says "stop" (Note [Elastic growth]).
  bool wait_for_kill(std::atomic<bool>* stop = nullptr);

 private:
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace loom
