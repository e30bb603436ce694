#include "loom/comm/thread_backend.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "loom/comm/world.h"

namespace loom::comm {

// Message key: (transport, sender's group rank, tag, per-(sender, receiver, tag) number).
// Receives take tickets in post order and match the message with the same number, which
// gives Note [Transport contract]'s ordering.
using MessageKey = std::tuple<uint64_t, int, int, uint64_t>;

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t version = 0;  // bumped at every delivery
  std::map<MessageKey, std::vector<std::byte>> messages;
};

class ThreadHub {
 public:
  ThreadHub(int n, std::vector<std::string> hosts) : n_(n), hosts_(std::move(hosts)), sources_(n), notes_(n) {
    if (hosts_.empty()) hosts_.assign(n, "localhost");
    LOOM_CHECK(static_cast<int>(hosts_.size()) == n, "thread world of ", n, " ranks given ", hosts_.size(), " hosts");
    for (int r = 0; r < n; ++r) inboxes_.push_back(std::make_unique<Inbox>());
  }
  int size() const { return n_; }
  Inbox& inbox(int global_rank) { return *inboxes_.at(global_rank); }
  const std::vector<std::string>& hosts() const { return hosts_; }

  // The regions of one group: transport `key` (all groups of one make_transport call
  // share it) and the group's first member tell groups apart. Made by the first to ask.
  std::vector<std::byte*> shared_regions(uint64_t key, int first_member, int n) {
    std::lock_guard<std::mutex> lock(shared_mu_);
    auto& regions = shared_[{key, first_member}];
    if (regions.empty())
      for (int i = 0; i < n; ++i) {
        regions.emplace_back(new (std::align_val_t{64}) std::byte[SharedSegment::kRegionBytes]);
        std::memset(regions.back().get(), 0, SharedSegment::kRegionBytes);
      }
    std::vector<std::byte*> out;
    for (auto& p : regions) out.push_back(p.get());
    return out;
  }

  void set_source(int r, std::function<RankStatus()> f) {
    std::lock_guard<std::mutex> lock(status_mu_);
    sources_[r] = std::move(f);
  }
  void set_note(int r, const std::string& note) {
    std::lock_guard<std::mutex> lock(status_mu_);
    notes_[r] = note;
  }
  std::vector<RankStatus> collect() {
    std::lock_guard<std::mutex> lock(status_mu_);
    std::vector<RankStatus> out(n_);
    for (int r = 0; r < n_; ++r) {
      if (sources_[r]) {
        out[r] = sources_[r]();
      } else {
        out[r].global_rank = r;
        out[r].state = notes_[r].empty() ? "has no comm world (not started, or finished)" : notes_[r];
        out[r].last = "unknown";
      }
    }
    return out;
  }

 private:
  int n_;
  std::vector<std::string> hosts_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::mutex shared_mu_;
  std::map<std::pair<uint64_t, int>, std::vector<std::unique_ptr<std::byte[], AlignedDelete>>> shared_;
  std::mutex status_mu_;
  std::vector<std::function<RankStatus()>> sources_;
  std::vector<std::string> notes_;
};

namespace {

class ThreadSegment final : public SharedSegment {
 public:
  explicit ThreadSegment(std::vector<std::byte*> regions) : regions_(std::move(regions)) {}
  std::byte* region(int group_rank) override { return regions_[group_rank]; }

 private:
  std::vector<std::byte*> regions_;
};

class ThreadTransport final : public Transport {
 public:
  ThreadTransport(ThreadHub& hub, uint64_t key, std::vector<int> members, int group_rank)
      : hub_(hub), key_(key), members_(std::move(members)), group_rank_(group_rank),
        inbox_(hub.inbox(members_[group_rank])) {
    bool one_host = true;
    for (int m : members_) one_host = one_host && hub.hosts()[m] == hub.hosts()[members_[0]];
    if (one_host) {
      segment_ = std::make_unique<ThreadSegment>(hub.shared_regions(key_, members_[0], size()));
      // All ranks of a thread world share the process's cores.
      segment_->set_members(hub.size());
    }
  }
  SharedSegment* shared() override { return segment_.get(); }

  int size() const override { return static_cast<int>(members_.size()); }
  int rank() const override { return group_rank_; }

  TransferId isend(std::span<const std::byte> data, int peer, int tag) override {
    Inbox& dst = hub_.inbox(members_.at(peer));
    const uint64_t number = send_numbers_[{peer, tag}]++;
    {
      std::lock_guard<std::mutex> lock(dst.mu);
      dst.messages.emplace(MessageKey{key_, group_rank_, tag, number},
                           std::vector<std::byte>(data.begin(), data.end()));
      ++dst.version;
    }
    dst.cv.notify_all();
    const TransferId id = next_id_++;
    pending_[id] = Pending{true, peer, tag, 0, {}};
    return id;
  }

  TransferId irecv(std::span<std::byte> data, int peer, int tag) override {
    LOOM_ASSERT(peer >= 0 && peer < size(), "receive from group rank ", peer);
    const TransferId id = next_id_++;
    pending_[id] = Pending{false, peer, tag, recv_tickets_[{peer, tag}]++, data};
    return id;
  }

  bool test(TransferId id) override {
    auto it = pending_.find(id);
    if (it == pending_.end()) return true;
    Pending& p = it->second;
    if (!p.done) {
      std::lock_guard<std::mutex> lock(inbox_.mu);
      seen_version_ = inbox_.version;
      auto m = inbox_.messages.find(MessageKey{key_, p.peer, p.tag, p.ticket});
      if (m != inbox_.messages.end()) {
        if (m->second.size() != p.buffer.size())
          throw CommError(detail::cat("received ", m->second.size(), " bytes from group rank ", p.peer, " (tag ", p.tag,
                                      ") into a buffer of ", p.buffer.size(),
                                      " bytes: the ranks disagree about the count"));
        if (!p.buffer.empty()) std::memcpy(p.buffer.data(), m->second.data(), p.buffer.size());
        inbox_.messages.erase(m);
        p.done = true;
      }
    }
    if (!p.done) return false;
    pending_.erase(it);
    return true;
  }

  void cancel(TransferId id) override { pending_.erase(id); }

  void idle(Clock::time_point until, Clock::duration) override {
    std::unique_lock<std::mutex> lock(inbox_.mu);
    inbox_.cv.wait_until(lock, until, [&] { return inbox_.version != seen_version_; });
  }

 private:
  struct Pending {
    bool done;
    int peer, tag;
    uint64_t ticket;
    std::span<std::byte> buffer;
  };
  struct PairHash {
    size_t operator()(const std::pair<int, int>& p) const { return std::hash<int64_t>()((int64_t(p.first) << 32) ^ p.second); }
  };
  ThreadHub& hub_;
  uint64_t key_;
  std::vector<int> members_;
  int group_rank_;
  Inbox& inbox_;
  std::unique_ptr<ThreadSegment> segment_;
  uint64_t seen_version_ = 0;
  TransferId next_id_ = 1;
  std::unordered_map<TransferId, Pending> pending_;
  std::unordered_map<std::pair<int, int>, uint64_t, PairHash> send_numbers_, recv_tickets_;
};

class ThreadBackend final : public Backend {
 public:
  ThreadBackend(std::shared_ptr<ThreadHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  std::string name() const override { return "threads"; }
  int world_size() const override { return hub_->size(); }
  int global_rank() const override { return rank_; }
  std::vector<std::string> hosts() override { return hub_->hosts(); }

  // Collective over the world, so every rank's k-th call names the same transport.
  std::unique_ptr<Transport> make_transport(const std::vector<std::vector<int>>& groups, const std::string&) override {
    const uint64_t key = next_key_++;
    for (const auto& g : groups)
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] == rank_) return std::make_unique<ThreadTransport>(*hub_, key, g, static_cast<int>(i));
    return nullptr;
  }
  void set_status_source(std::function<RankStatus()> source) override { hub_->set_source(rank_, std::move(source)); }
  void serve() override {}
  std::vector<RankStatus> collect(std::chrono::milliseconds) override { return hub_->collect(); }

 private:
  std::shared_ptr<ThreadHub> hub_;
  int rank_;
  uint64_t next_key_ = 1;
};

}  // namespace

std::shared_ptr<ThreadHub> make_thread_hub(int world_size, std::vector<std::string> hosts) {
  LOOM_CHECK(world_size >= 1, "thread world size must be >= 1, got ", world_size);
  return std::make_shared<ThreadHub>(world_size, std::move(hosts));
}

std::unique_ptr<Backend> make_thread_backend(std::shared_ptr<ThreadHub> hub, int global_rank) {
  LOOM_CHECK(global_rank >= 0 && global_rank < hub->size(), "rank ", global_rank, " outside thread world of ", hub->size());
  return std::make_unique<ThreadBackend>(std::move(hub), global_rank);
}

void mark_thread_exited(ThreadHub& hub, int global_rank, const std::string& note) { hub.set_note(global_rank, note); }

std::vector<std::string> run_threads(int n, const CommOptions& options, const std::function<void(World&)>& fn,
                                     std::vector<std::string> hosts) {
  auto hub = make_thread_hub(n, std::move(hosts));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::string note = "exited: returned normally";
      try {
        World world(make_thread_backend(hub, r), options);
        fn(world);
      } catch (const std::exception& e) {
        errors[r] = *e.what() ? e.what() : "error without a message";
        note = "exited with error: " + errors[r];
      }
      mark_thread_exited(*hub, r, note.substr(0, note.find('\n')));
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace loom::comm
