#include "loom/comm/mpi_backend.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "loom/comm/algorithms.h"

namespace loom::comm {
namespace {

constexpr int kTagStatusRequest = 1;
constexpr int kTagStatusReply = 2;
// MPI counts are int: larger transfers are cut into pieces of this many bytes, sent in
// order under one tag (MPI keeps them ordered).
constexpr size_t kMaxPieceBytes = size_t{1} << 30;

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(detail::cat(what, " failed: ", std::string(text, len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kI8: return MPI_INT8_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kBF16: break;
  }
  throw Error("the native MPI collectives have no bf16 type; use algorithm ring or recursive for bf16");
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }  // avg: sum, divided after

int to_int(size_t count, const char* what) {
  LOOM_CHECK(count <= static_cast<size_t>(INT_MAX), what, ": ", count, " elements exceed MPI's int count limit");
  return static_cast<int>(count);
}

// One pending transfer: one or more MPI requests.
struct Pending {
  std::vector<MPI_Request> requests;
};

// MPI-3 shared window over a group whose members all share a node.
class MpiSegment final : public SharedSegment {
 public:
  MpiSegment(MPI_Comm comm, int size) : regions_(size) {
    std::byte* base = nullptr;
    check_mpi(MPI_Win_allocate_shared(static_cast<MPI_Aint>(kRegionBytes), 1, MPI_INFO_NULL, comm, &base, &win_),
              "MPI_Win_allocate_shared");
    for (int r = 0; r < size; ++r) {
      MPI_Aint bytes = 0;
      int disp = 0;
      check_mpi(MPI_Win_shared_query(win_, r, &bytes, &disp, &regions_[r]), "MPI_Win_shared_query");
    }
    std::memset(base, 0, kRegionBytes);
    check_mpi(MPI_Barrier(comm), "MPI_Barrier after the shared window");
  }
  ~MpiSegment() override {
    if (!std::uncaught_exceptions()) MPI_Win_free(&win_);
  }
  std::byte* region(int group_rank) override { return regions_[group_rank]; }

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<std::byte*> regions_;
};

class MpiTransport final : public Transport, public NativeCollectives {
 public:
  // Collective over comm (makes the shared window when every member is on this node).
  // local_ranks: processes of the whole job on this node (they compete for its cores).
  MpiTransport(std::mutex& mu, MPI_Comm comm, int local_ranks) : mu_(mu), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);

    int one_node = node_size == size_ ? 1 : 0;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &one_node, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    if (one_node) {
      segment_ = std::make_unique<MpiSegment>(comm_, size_);
      segment_->set_members(local_ranks);
    }
  }
  ~MpiTransport() override {
    std::lock_guard<std::mutex> lock(mu_);
    segment_.reset();
    for (auto& [id, p] : pending_)
      for (MPI_Request& r : p.requests)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
    if (!std::uncaught_exceptions()) MPI_Comm_free(&comm_);
  }
  int size() const override { return size_; }
  int rank() const override { return rank_; }

  TransferId isend(std::span<const std::byte> data, int peer, int tag) override {
    return post(const_cast<std::byte*>(data.data()), data.size(), [&](std::byte* p, int n, MPI_Request* r) {
      return MPI_Isend(p, n, MPI_BYTE, peer, tag, comm_, r);
    });
  }

  TransferId irecv(std::span<std::byte> data, int peer, int tag) override {
    return post(data.data(), data.size(), [&](std::byte* p, int n, MPI_Request* r) {
      return MPI_Irecv(p, n, MPI_BYTE, peer, tag, comm_, r);
    });
  }

  bool test(TransferId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return true;
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(it->second.requests.size()), it->second.requests.data(), &flag,
                               MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      pending_.erase(it);
      check_mpi(rc, "a point-to-point transfer (a truncated message means the ranks disagree about the count)");
    }
    if (!flag) return false;
    pending_.erase(it);
    return true;
  }

  void cancel(TransferId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    for (MPI_Request& r : it->second.requests)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    pending_.erase(it);
  }

  // Note [Polling backoff]: a wait polls MPI with yields for its first 10 ms (transfers and
  // collectives in flight progress at full speed), then sleeps 20 us between polls, so a rank
  // that waits long (a parameter server's receive per worker, a peer still computing) leaves
  // the cores to the ranks that compute instead of spinning on them.
  void idle(Clock::time_point until, Clock::duration waited) override {
    if (background_nap(waited, until)) return;  // Note [Background waits]
    if (waited < std::chrono::milliseconds(10)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  NativeCollectives* native() override { return this; }
  SharedSegment* shared() override { return segment_.get(); }
  bool posts_from_any_thread() const override { return true; }  // mu_ around every MPI call

  TransferId all_reduce(std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype,
                        ReduceOp op) override {
    return start([&](MPI_Request* r) {
      const void* send = in.data() == out.data() ? MPI_IN_PLACE : in.data();
      return MPI_Iallreduce(send, out.data(), to_int(count, "all_reduce"), mpi_type(dtype), mpi_op(op), comm_, r);
    });
  }
  TransferId reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype,
                            ReduceOp op) override {
    return start([&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.data(), out.data(), to_int(count, "reduce_scatter"), mpi_type(dtype),
                                       mpi_op(op), comm_, r);
    });
  }
  TransferId all_gather(std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype) override {
    return start([&](MPI_Request* r) {
      const bool in_place = in.data() == out.data() + count * dtype_bytes(dtype) * rank_;
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), to_int(count, "all_gather"), mpi_type(dtype),
                            out.data(), to_int(count, "all_gather"), mpi_type(dtype), comm_, r);
    });
  }
  TransferId broadcast(std::span<std::byte> data, size_t count, DType dtype, int root) override {
    return start([&](MPI_Request* r) {
      return MPI_Ibcast(data.data(), to_int(count, "broadcast"), mpi_type(dtype), root, comm_, r);
    });
  }
  TransferId all_to_all(std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype) override {
    return start([&](MPI_Request* r) {
      return MPI_Ialltoall(in.data(), to_int(count, "all_to_all"), mpi_type(dtype), out.data(),
                           to_int(count, "all_to_all"), mpi_type(dtype), comm_, r);
    });
  }

 private:
  template <typename F>
  TransferId start(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    Pending p;
    p.requests.emplace_back();
    check_mpi(f(&p.requests.back()), "native MPI collective");
    return add(std::move(p));
  }
  // Starts one transfer as pieces of at most kMaxPieceBytes (an empty one still posts once).
  template <typename Start>
  TransferId post(std::byte* data, size_t bytes, Start&& start) {
    std::lock_guard<std::mutex> lock(mu_);
    Pending p;
    size_t off = 0;
    do {
      const size_t n = std::min(kMaxPieceBytes, bytes - off);
      p.requests.emplace_back();
      check_mpi(start(data + off, static_cast<int>(n), &p.requests.back()), "starting a point-to-point transfer");
      off += n;
    } while (off < bytes);
    return add(std::move(p));
  }
  TransferId add(Pending p) {
    const TransferId id = next_id_++;
    pending_.emplace(id, std::move(p));
    return id;
  }

  std::mutex& mu_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<MpiSegment> segment_;
  TransferId next_id_ = 1;
  std::unordered_map<TransferId, Pending> pending_;
};

// Note [Shared-memory eager limit]
// Open MPI's shared-memory transport (vader; sm from Open MPI 5) sends a message of up to
// its eager limit (4 KiB by default) through a shared buffer: the sender copies it in at the
// send, the receiver out when it matches. A larger one is read by the receiver straight out
// of the sender's memory (CMA, process_vm_readv) once it matches, on the receiver's thread:
// on this project's 2-core machine that read ran at 2.7-4 GB/s, a memcpy at 16 GB/s. A
// pipeline stage that receives an activation or gradient its peer had sent long before
// waited that read out: config A at pp 2 (zb-v) moves 128 KiB messages, and each receive
// took 23-81 us where the message had been there for 0.3-1.8 ms (MPI_Irecv alone; 15-16 a
// step on each stage, a 46 ms step). Through the shared buffer (an eager limit of 256 KiB)
// they took 3-10 us, and the bubble over the measured floor fell from 2.4-3.9 to 1.2-1.9
// points in six alternating pairs; loom's ring all-reduce on two ranks moved 64 KiB at 4.2
// GB/s instead of 2.4 and 256 KiB at 8.3 instead of 4.4 (bench comm; 1 MiB and up,
// over the limit, unchanged). So loom raises the limit to 256 KiB before MPI starts, unless
// the environment already sets it (OMPI_MCA_btl_vader_eager_limit, _sm_ on Open MPI 5): a
// larger limit makes every buffer of the transport's fixed 4 MiB segment that large, and at
// 512 KiB small messages ran slower. Other MPI libraries are left as they are.
void raise_shared_memory_eager_limit() {
#if defined(OMPI_MAJOR_VERSION)
  const char* name = OMPI_MAJOR_VERSION >= 5 ? "OMPI_MCA_btl_sm_eager_limit" : "OMPI_MCA_btl_vader_eager_limit";
  setenv(name, "262144", /*overwrite=*/0);  // read by MPI_Init; a user's setting stands
#endif
}

class MpiBackend final : public Backend {
 public:
  MpiBackend() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      raise_shared_memory_eager_limit();  // Note [Shared-memory eager limit]
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_init_ = true;
      LOOM_CHECK(provided >= MPI_THREAD_SERIALIZED, "the MPI library offers thread level ", provided,
                 "; loom needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &world_);
    MPI_Comm_dup(MPI_COMM_WORLD, &status_comm_);
    MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(status_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world_, &rank_);
    MPI_Comm_size(world_, &size_);
    set_global_rank_for_diagnostics(rank_);
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    MPI_Comm_size(node, &local_ranks_);
    watch_node_peers(node);
    MPI_Comm_free(&node);
  }
  ~MpiBackend() override {
    if (std::uncaught_exceptions()) return;  // a failed rank must not wait in MPI_Finalize
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : replies_) MPI_Wait(&s.request, MPI_STATUS_IGNORE);
    MPI_Comm_free(&status_comm_);
    MPI_Comm_free(&world_);
    if (owns_init_) MPI_Finalize();
  }

  std::string name() const override { return "mpi"; }
  int world_size() const override { return size_; }
  int global_rank() const override { return rank_; }

  std::vector<std::string> hosts() override {
    std::lock_guard<std::mutex> lock(mu_);
    char mine[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(mine, &len);
    std::vector<char> all(static_cast<size_t>(MPI_MAX_PROCESSOR_NAME) * size_);
    check_mpi(MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world_),
              "MPI_Allgather of host names");
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    return out;
  }

  std::unique_ptr<Transport> make_transport(const std::vector<std::vector<int>>& groups, const std::string&) override {
    int color = MPI_UNDEFINED, key = 0;
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].size(); ++i)
        if (groups[g][i] == rank_) {
          color = static_cast<int>(g);
          key = static_cast<int>(i);
        }
    MPI_Comm comm = MPI_COMM_NULL;
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_mpi(MPI_Comm_split(world_, color, key, &comm), "MPI_Comm_split");
    }
    if (comm == MPI_COMM_NULL) return nullptr;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    std::lock_guard<std::mutex> lock(mu_);
    return std::make_unique<MpiTransport>(mu_, comm, local_ranks_);
  }

  void set_status_source(std::function<RankStatus()> source) override {
    std::lock_guard<std::mutex> lock(source_mu_);
    source_ = std::move(source);
  }

  // Answers every pending status request with this rank's status.
  void serve() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    serve_locked();
  }

  std::vector<int> dead_ranks() override {
    std::vector<int> out;
    for (auto [r, pid] : peer_pids_)
      if (process_gone(pid)) out.push_back(r);
    return out;
  }

  // One collection at a time: two threads of a rank diagnosing at once (a collective on a
  // worker thread and one on the main thread) would take each other's replies off the
  // shared channel and one would wait out its grace for answers the other had discarded.
  // A collection finished in the last half second is answer enough for the second.
  std::vector<RankStatus> collect(std::chrono::milliseconds grace) override {
    std::lock_guard<std::mutex> one_at_a_time(collect_mu_);
    if (!last_collect_.empty() && Clock::now() - last_collect_at_ < std::chrono::milliseconds(500)) return last_collect_;
    last_collect_ = collect_now(grace);
    last_collect_at_ = Clock::now();
    return last_collect_;
  }

 private:
  std::vector<RankStatus> collect_now(std::chrono::milliseconds grace) {
    std::vector<RankStatus> out(size_);
    out[rank_] = my_status();
    std::vector<bool> have(size_, false);
    have[rank_] = true;
    int missing = size_ - 1;
    // A dead rank will not answer: do not wait for it (nor for one that dies meanwhile,
    // e.g. a survivor that has diagnosed the same failure and left).
    auto drop_dead = [&] {
      for (int r : dead_ranks())
        if (!have[r]) {
          out[r].global_rank = -1;
          out[r].state = detail::cat("dead: its process (pid ", peer_pids_.at(r), " on this host) is gone");
          have[r] = true;
          --missing;
        }
    };
    drop_dead();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int r = 0; r < size_; ++r)
        if (r != rank_) {
          MPI_Request req;
          MPI_Isend(nullptr, 0, MPI_BYTE, r, kTagStatusRequest, status_comm_, &req);
          MPI_Request_free(&req);
        }
    }
    const Clock::time_point until = Clock::now() + grace;
    Clock::time_point next_check = Clock::now() + std::chrono::milliseconds(100);
    while (missing > 0 && Clock::now() < until) {
      if (Clock::now() >= next_check) {
        drop_dead();
        next_check = Clock::now() + std::chrono::milliseconds(100);
        if (missing == 0) break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      serve_locked();
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagStatusReply, status_comm_, &flag, &st);
      if (!flag) continue;
      int bytes = 0;
      MPI_Get_count(&st, MPI_CHAR, &bytes);
      std::string text(static_cast<size_t>(bytes), '\0');
      MPI_Recv(text.data(), bytes, MPI_CHAR, st.MPI_SOURCE, kTagStatusReply, status_comm_, MPI_STATUS_IGNORE);
      if (!have[st.MPI_SOURCE]) {
        out[st.MPI_SOURCE] = decode_status(text);
        have[st.MPI_SOURCE] = true;
        --missing;
      }
    }
    for (int r = 0; r < size_; ++r)
      if (!have[r]) out[r].global_rank = -1;
    return out;
  }

  // A process that no longer exists, or a zombie its launcher has not reaped yet.
  static bool process_gone(int pid) {
    if (::kill(pid, 0) != 0) return errno == ESRCH;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(stat, text);
    const size_t paren = text.rfind(')');
    return paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
  }
  // Pids of the other ranks on this node (collective over `node`). Skipped when any of
  // them is invisible from here (another pid namespace): then nothing is ever called dead.
  void watch_node_peers(MPI_Comm node) {
    int n = 0;
    MPI_Comm_size(node, &n);
    const int mine[2] = {rank_, int(::getpid())};
    std::vector<int> all(size_t(2 * n));
    check_mpi(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, node), "MPI_Allgather of pids");
    for (int i = 0; i < n; ++i)
      if (all[size_t(2 * i)] != rank_) peer_pids_[all[size_t(2 * i)]] = all[size_t(2 * i + 1)];
    for (auto [r, pid] : peer_pids_)
      if (::kill(pid, 0) != 0 && errno == ESRCH) {
        peer_pids_.clear();
        return;
      }
  }

  struct Reply {
    std::string text;
    MPI_Request request;
  };
  RankStatus my_status() {
    std::lock_guard<std::mutex> lock(source_mu_);
    if (source_) return source_();
    RankStatus s;
    s.global_rank = rank_;
    s.state = "has no comm world";
    return s;
  }
  void serve_locked() {
    for (auto it = replies_.begin(); it != replies_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? replies_.erase(it) : std::next(it);
    }
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagStatusRequest, status_comm_, &flag, &st);
      if (!flag) return;
      MPI_Recv(nullptr, 0, MPI_BYTE, st.MPI_SOURCE, kTagStatusRequest, status_comm_, MPI_STATUS_IGNORE);
      replies_.push_back({encode_status(my_status()), MPI_REQUEST_NULL});
      Reply& r = replies_.back();
      MPI_Isend(r.text.data(), static_cast<int>(r.text.size()), MPI_CHAR, st.MPI_SOURCE, kTagStatusReply, status_comm_,
                &r.request);
    }
  }

  std::mutex mu_;  // every MPI call
  std::mutex source_mu_;
  std::mutex collect_mu_;                    // collect(): one at a time
  std::vector<RankStatus> last_collect_;
  Clock::time_point last_collect_at_{};
  std::function<RankStatus()> source_;
  std::list<Reply> replies_;
  MPI_Comm world_ = MPI_COMM_NULL, status_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int local_ranks_ = 1;  // processes of this job on this node
  std::unordered_map<int, int> peer_pids_;  // global rank -> pid, for the other ranks on this node
  bool owns_init_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend() { return std::make_unique<MpiBackend>(); }

void mpi_user_collective(OpKind op, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype) {
  const MPI_Datatype t = mpi_type(dtype);
  const int c = to_int(count, "mpi collective");
  int rc = MPI_SUCCESS;
  switch (op) {
    case OpKind::kAllReduce: rc = MPI_Allreduce(MPI_IN_PLACE, out.data(), c, t, MPI_SUM, MPI_COMM_WORLD); break;
    case OpKind::kBroadcast: rc = MPI_Bcast(out.data(), c, t, 0, MPI_COMM_WORLD); break;
    case OpKind::kReduceScatter:
      rc = MPI_Reduce_scatter_block(in.data(), out.data(), c, t, MPI_SUM, MPI_COMM_WORLD);
      break;
    case OpKind::kAllGather: rc = MPI_Allgather(in.data(), c, t, out.data(), c, t, MPI_COMM_WORLD); break;
    case OpKind::kAllToAll: rc = MPI_Alltoall(in.data(), c, t, out.data(), c, t, MPI_COMM_WORLD); break;
    default: throw Error(detail::cat("no MPI peer for ", op_name(op)));
  }
  check_mpi(rc, "MPI collective");
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace loom::comm
