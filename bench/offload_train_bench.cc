// training.offload's cost in a whole training step: the same job (RunJob, synthetic tokens) with
// offload none, cpu (host RAM store), nvme (the default nvme store, the value log, in --dir; each
// step's commit runs behind the next step's forward and backward), nvme-sync (the same store
// committing inside the step: what committing behind compute hides) and nvme-rocksdb (the RocksDB
// store, commit behind compute), in one process, one after another, each
// timed over the same steps after warm-up. Prints per mode the median step time,
// the ratio to no offload, the optimizer-state bytes read and written per step, the seconds a step
// waited on the store (I/O not hidden), the store threads' I/O time behind compute, and the device
// bytes the plan puts on the optimizer.
//
//   offload_train_bench [--model tiny|small] [--steps N] [--warmup W] [--threads T] [--dir DIR]
//                       [--rounds R] [--bf16] [--max-grad-norm X]
// --bf16: bf16 compute; the offloaded modes then keep the fp32 master weights in the store too
// (device_total_MiB drops by them; read/written per step grow by 4 bytes a parameter).
// --max-grad-norm X (default 1, the HF default): 0 turns clipping off, so the offloaded AdamW
// updates each block's chunks while backward goes on (updated_in_backward: the fraction of the
// parameters it updated then).
// RESULT lines: "RESULT side=traind model=small offload=nvme step_ms=... ratio=...".
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "traind/engine/trainer.h"
#include "traind/offload/offload.h"

namespace traind::bench {
namespace {

namespace fs = std::filesystem;
using engine::JobSpec;

struct Args {
  std::string model = "small";
  int steps = 6;
  int warmup = 2;
  int threads = 2;
  int rounds = 1;
  bool bf16 = false;
  double max_grad_norm = 1.0;
  std::string dir = "/tmp/traind-offload-train-bench";
};

void WriteTokens(const std::string& path, int64_t n, int vocab) {
  std::mt19937 rng(7);
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<uint16_t>(rng() % static_cast<uint32_t>(vocab));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
}

JobSpec Spec(const Args& a, const std::string& data, const std::string& offload) {
  JobSpec s;
  s.name = "offload-bench";
  auto& c = s.model.config;
  c.arch = engine::Arch::kGpt2;
  const bool small = a.model == "small";
  c.vocab_size = small ? 50304 : 256;
  c.n_positions = small ? 256 : 128;
  c.n_embd = small ? 384 : 256;
  c.n_layer = small ? 6 : 4;
  c.n_head = small ? 6 : 4;
  s.data.train_file = data;
  s.data.format = "tokens";
  s.data.token_dtype = "uint16";
  s.data.seq_len = c.n_positions;
  s.data.validation_split = 0.0;
  s.training.max_steps = a.warmup + a.steps;
  s.training.per_device_train_batch_size = 8;
  s.training.learning_rate = 1e-4;
  s.training.weight_decay = 0.1;
  s.training.logging_steps = 1000;
  s.training.bf16 = a.bf16;
  s.training.max_grad_norm = a.max_grad_norm;
  const bool nvme = offload == "nvme" || offload == "nvme-sync" || offload == "nvme-rocksdb";
  s.training.offload = nvme ? "nvme" : offload;
  if (nvme) s.training.offload_dir = a.dir + "/store";
  s.output_dir = a.dir + "/out-" + offload;
  return s;
}

struct ModeResult {
  std::vector<double> step_seconds;
  double read_bytes = 0, written_bytes = 0, io_seconds = 0, background_io_seconds = 0, updated_early = 0;
  int64_t store_bytes = 0, optimizer_device_bytes = 0, total_device_bytes = 0, params = 0;
  bool ok = false;
};

ModeResult RunMode(const Args& a, const std::string& data, const std::string& offload) {
  ModeResult m;
  fs::remove_all(a.dir + "/store");
  fs::remove_all(a.dir + "/out-" + offload);
  engine::RunOptions o;
  o.device.device = "cpu";
  o.device.threads = a.threads;
  const bool sync = offload == "nvme-sync";  // the commit in the step, not behind the next one
  const std::string kind = offload == "nvme-rocksdb" ? "rocksdb" : "";  // else the default store
  o.open_optimizer_state_store =
      [sync, kind](const engine::TrainingSpec& t) -> Result<std::unique_ptr<engine::OptimizerStateStore>> {
    if (t.offload == "cpu") return offload::MakeHostStore();
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<engine::OptimizerStateStore> store,
                            offload::MakeNvmeStore(*t.offload_dir, kind));
    if (!sync) return store;
    return std::unique_ptr<engine::OptimizerStateStore>(
        std::make_unique<offload::CommitInCallerStore>(std::move(store)));
  };
  engine::RunCallbacks cb;
  cb.on_step = [&](const engine::StepReport& r) {
    if (r.step <= a.warmup) return;
    m.step_seconds.push_back(r.step_seconds);
    m.read_bytes += static_cast<double>(r.offload_read_bytes);
    m.written_bytes += static_cast<double>(r.offload_written_bytes);
    m.io_seconds += r.offload_io_seconds;
    m.background_io_seconds += r.offload_background_io_seconds;
    m.store_bytes = r.offload_store_bytes;
    m.updated_early += static_cast<double>(r.offload_updated_during_backward);
  };
  auto run = engine::RunJob(Spec(a, data, offload), o, cb);
  if (!run.ok()) {
    std::fprintf(stderr, "offload %s: %s\n", offload.c_str(), run.status().ToString().c_str());
    return m;
  }
  m.params = run->plan.trainable_params;
  m.optimizer_device_bytes = run->plan.bytes.optimizer;
  m.total_device_bytes = run->plan.bytes.total();
  m.ok = true;
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--model") a.model = FlagValue(argc, argv, &i);
    else if (f == "--steps") a.steps = std::atoi(FlagValue(argc, argv, &i));
    else if (f == "--warmup") a.warmup = std::atoi(FlagValue(argc, argv, &i));
    else if (f == "--threads") a.threads = std::atoi(FlagValue(argc, argv, &i));
    else if (f == "--rounds") a.rounds = std::atoi(FlagValue(argc, argv, &i));
    else if (f == "--dir") a.dir = FlagValue(argc, argv, &i);
    else if (f == "--bf16") a.bf16 = true;
    else if (f == "--max-grad-norm") a.max_grad_norm = std::atof(FlagValue(argc, argv, &i));
    else {
      std::fprintf(stderr, "usage: offload_train_bench [--model tiny|small] [--steps N] [--warmup W] "
                           "[--threads T] [--rounds R] [--dir DIR] [--bf16] [--max-grad-norm X]\n");
      return 2;
    }
  }
  if (a.model != "tiny" && a.model != "small") {
    std::fprintf(stderr, "--model: tiny or small\n");
    return 2;
  }
  fs::create_directories(a.dir);
  const std::string data = a.dir + "/tokens.bin";
  WriteTokens(data, 400000, a.model == "small" ? 50257 : 256);
  const std::vector<std::string> modes = {"none", "cpu", "nvme", "nvme-sync", "nvme-rocksdb"};
  std::map<std::string, std::vector<double>> times;
  std::map<std::string, ModeResult> last;
  // Rounds interleave the modes, so a slow spell of a shared machine hits all of them.
  for (int r = 0; r < a.rounds; ++r) {
    for (const std::string& mode : modes) {
      ModeResult m = RunMode(a, data, mode);
      if (!m.ok) return 1;
      times[mode].insert(times[mode].end(), m.step_seconds.begin(), m.step_seconds.end());
      last[mode] = m;
    }
  }
  const double base = Median(times["none"]);
  for (const std::string& mode : modes) {
    const ModeResult& m = last[mode];
    const double med = Median(times[mode]);
    const double n = static_cast<double>(std::max<size_t>(1, m.step_seconds.size()));
    std::printf("RESULT side=traind model=%s offload=%s dtype=%s threads=%d step_ms=%.1f ratio_vs_none=%.3f "
                "read_MiB_per_step=%.2f written_MiB_per_step=%.2f io_wait_ms_per_step=%.2f "
                "background_io_ms_per_step=%.2f store_MiB=%.1f optimizer_device_MiB=%.2f "
                "device_total_MiB=%.1f max_grad_norm=%g updated_in_backward=%.3f\n",
                a.model.c_str(), mode.c_str(), a.bf16 ? "bf16" : "fp32", a.threads, 1000 * med, med / base,
                m.read_bytes / n / 1048576.0, m.written_bytes / n / 1048576.0,
                1000 * m.io_seconds / n, 1000 * m.background_io_seconds / n,
                static_cast<double>(m.store_bytes) / 1048576.0,
                static_cast<double>(m.optimizer_device_bytes) / 1048576.0,
                static_cast<double>(m.total_device_bytes) / 1048576.0, a.max_grad_norm,
                m.params > 0 ? m.updated_early / n / static_cast<double>(m.params) : 0.0);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS of the whole run: %.1f MiB\n", static_cast<double>(ru.ru_maxrss) / 1024.0);
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) { return traind::bench::Main(argc, argv); }
