#include "loom/cuda/nccl.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <span>
#include <thread>

#include "loom/comm/group.h"
#include "loom/comm/transport.h"
#include "loom/core/error.h"
#include "loom/cuda/check.h"

#if LOOM_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace loom::cuda {

int gpu_for_rank(const std::vector<std::string>& hosts, int rank, int device_count) {
  LOOM_CHECK(rank >= 0 && rank < int(hosts.size()), "rank outside the host list");
  int local = 0, on_host = 0;
  for (int r = 0; r < int(hosts.size()); r++)
    if (hosts[r] == hosts[rank]) (r < rank ? local : on_host)++;
  on_host += local;
  if (local >= device_count)
    throw ConfigError("train.device = cuda: host " + hosts[rank] + " runs " + std::to_string(on_host) +
                      " ranks but has " + std::to_string(device_count) + " GPU" + (device_count == 1 ? "" : "s") +
                      " (NCCL needs one GPU per rank); launch at most " + std::to_string(device_count) +
                      " ranks per host, or lower parallel.dp");
  return local;
}

#if LOOM_NCCL

namespace {

using Clock = std::chrono::steady_clock;

// libnccl.so.2, opened on first use (so a single-GPU run needs no NCCL installed); the
// calls below go through these pointers, which nccl.h's declarations type.
struct Lib {
  void* handle = nullptr;
  std::string error;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&::ncclCommGetAsyncError) async_error = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclCommDestroy) destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  template <class F>
  void bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    if (!f && error.empty()) error = std::string("libnccl.so.2 has no ") + name;
  }
};

const Lib& lib() {
  static const Lib l = [] {
    Lib x;
    x.handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!x.handle) {
      const char* e = dlerror();
      x.error = std::string("libnccl.so.2 could not be loaded (") + (e ? e : "?") + ")";
      return x;
    }
    x.bind(x.get_unique_id, "ncclGetUniqueId");
    x.bind(x.init_rank_config, "ncclCommInitRankConfig");
    x.bind(x.async_error, "ncclCommGetAsyncError");
    x.bind(x.abort, "ncclCommAbort");
    x.bind(x.destroy, "ncclCommDestroy");
    x.bind(x.all_reduce, "ncclAllReduce");
    x.bind(x.broadcast, "ncclBroadcast");
    x.bind(x.error_string, "ncclGetErrorString");
    return x;
  }();
  return l;
}

std::string nccl_text(ncclResult_t r) {
  return std::string(lib().error_string(r)) + " (" + std::to_string(int(r)) + ")";
}

}  // namespace

bool nccl_available() { return lib().error.empty(); }

struct Nccl::Impl {
  ncclComm_t comm = nullptr;
  double timeout_s = 0;
  std::string group;

  // Waits while the non-blocking communicator is still in progress with the last call;
  // throws CommError on an error or the timeout (after aborting the communicator).
  void settle(const std::string& what) {
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = lib().async_error(comm, &state);
      if (r != ncclSuccess) fail(what, "ncclCommGetAsyncError: " + nccl_text(r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, nccl_text(state));
      if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) fail(what, timeout_text());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // A call's immediate result: in progress is settled, anything else but success fails.
  void called(ncclResult_t r, const std::string& what) {
    if (r == ncclInProgress) return settle(what);
    if (r != ncclSuccess) fail(what, nccl_text(r));
  }
  std::string timeout_text() const {
    return "not finished after comm.timeout_s = " + std::to_string(timeout_s) +
           " s: a peer rank died, hangs, or is far slower (raise comm.timeout_s if a step is that slow)";
  }
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    if (comm) lib().abort(comm);  // frees the kernels that wait for peers
    comm = nullptr;
    throw comm::CommError("NCCL " + what + " on " + group + ": " + why);
  }
};

Nccl::Nccl(comm::Group& group, double timeout_s) : p_(std::make_unique<Impl>()) {
  if (!nccl_available())
    throw ConfigError("train.device = cuda with parallel.dp > 1 needs NCCL: " + lib().error +
                      "; install NCCL 2 or put its directory on LD_LIBRARY_PATH, or train with parallel.dp = 1");
  LOOM_CONFIG_CHECK(timeout_s > 0, "comm.timeout_s must be > 0 for NCCL waits, got " + std::to_string(timeout_s));
  p_->timeout_s = timeout_s;
  p_->group = group.name();
  size_ = group.size(), rank_ = group.group_rank();
  ncclUniqueId id{};
  if (rank_ == 0) {
    const ncclResult_t r = lib().get_unique_id(&id);
    if (r != ncclSuccess) throw comm::CommError("ncclGetUniqueId failed: " + nccl_text(r));
  }
  std::vector<uint8_t> bytes(sizeof(id));
  std::memcpy(bytes.data(), &id, sizeof(id));
  group.broadcast(std::span<uint8_t>(bytes), 0).wait();
  std::memcpy(&id, bytes.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below polls, with the timeout
  p_->called(lib().init_rank_config(&p_->comm, size_, id, rank_, &config), "communicator start");
}

Nccl::~Nccl() {
  if (p_ && p_->comm) lib().destroy(p_->comm);
}

void Nccl::all_reduce_sum(float* data, int64_t n, void* stream) {
  p_->called(lib().all_reduce(data, data, size_t(n), ncclFloat32, ncclSum, p_->comm, static_cast<cudaStream_t>(stream)),
             "all-reduce of " + std::to_string(n) + " floats");
}

void Nccl::all_reduce_sum(double* data, int64_t n, void* stream) {
  p_->called(lib().all_reduce(data, data, size_t(n), ncclFloat64, ncclSum, p_->comm, static_cast<cudaStream_t>(stream)),
             "all-reduce of " + std::to_string(n) + " doubles");
}

void Nccl::broadcast(float* data, int64_t n, int root, void* stream) {
  p_->called(lib().broadcast(data, data, size_t(n), ncclFloat32, root, p_->comm, static_cast<cudaStream_t>(stream)),
             "broadcast of " + std::to_string(n) + " floats from rank " + std::to_string(root));
}

void Nccl::wait(void* stream, const std::string& what) {
  LOOM_CHECK(p_->comm, "NCCL communicator used after it failed");
  cudaEvent_t e;
  LOOM_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LOOM_CUDA_OK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
  const auto t0 = Clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      cudaEventDestroy(e);
      LOOM_CUDA_OK(q);
    }
    ncclResult_t state = ncclSuccess;
    lib().async_error(p_->comm, &state);
    const bool late = std::chrono::duration<double>(Clock::now() - t0).count() > p_->timeout_s;
    if ((state != ncclSuccess && state != ncclInProgress) || late) {
      cudaEventDestroy(e);
      p_->fail(what, late ? p_->timeout_text() : nccl_text(state));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  LOOM_CUDA_OK(cudaEventDestroy(e));
}

#else  // built without NCCL

bool nccl_available() { return false; }

struct Nccl::Impl {};

Nccl::Nccl(comm::Group&, double) {
  throw ConfigError("train.device = cuda with parallel.dp > 1 needs NCCL, and this loom was built without it "
                    "(nccl.h and libnccl were not found next to the CUDA toolkit); train with parallel.dp = 1");
}
Nccl::~Nccl() = default;
void Nccl::all_reduce_sum(float*, int64_t, void*) {}
void Nccl::all_reduce_sum(double*, int64_t, void*) {}
void Nccl::broadcast(float*, int64_t, int, void*) {}
void Nccl::wait(void*, const std::string&) {}

#endif

}  // namespace loom::cuda
