// offload_bench: throughput of the nvme OptimizerStateStores (write + commit, read with read-ahead,
// a read-update-write optimizer pass) beside the raw sequential bandwidth of the same directory
// measured by fio in the same run, and each store's write amplification (device bytes / state bytes).
//   offload_bench --dir /nvme/tmp [--state-mib 1024] [--chunk-mib 16] [--steps 3] [--no-fio]
//                 [--store rocksdb|valuelog|both] [--rounds N]
// `both` (the default) runs the RocksDB store (MakeRocksDbStore) and then the value-log store
// (MakeValueLogStore) on the same directory, one after the other, after the fio runs (buffered as
// before, and with O_DIRECT, the value-log store's kind of I/O).
// --rounds N (default 1) repeats fio and the stores N times, alternating, and ends with the medians:
// each store's write+commit and read bandwidth against the faster fio mode of the same direction
// (buffered or O_DIRECT: the raw bandwidth), the target being >= 80% (issue 11).
// Prints one RESULT line per store and round (and one SUMMARY line per store); bench/README.md ("offload") has the numbers and how to read them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "traind/offload/offload.h"

namespace {

namespace fs = std::filesystem;
using traind::engine::StateKey;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Flags {
  std::string dir;
  size_t state_mib = 1024;
  size_t chunk_mib = 16;
  int steps = 3;
  int depth = 4;  // read-ahead depth in chunks
  bool fio = true;
  size_t write_buffer_mib = 64;
  std::string store = "both";
  int rounds = 1;
  int write_threads = 0;  // 0: StoreOptions' default
};

struct Bandwidths {
  double write = 0, read = 0;  // bytes/s
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "offload_bench: %s\nusage: offload_bench [--dir DIR] [--state-mib N] [--chunk-mib N] "
               "[--steps N] [--depth N] [--write-buffer-mib N] [--no-fio] [--store rocksdb|valuelog|both] [--rounds N] [--write-threads N]\n",
               why);
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--dir") f.dir = next();
    else if (a == "--state-mib") f.state_mib = std::stoul(next());
    else if (a == "--chunk-mib") f.chunk_mib = std::stoul(next());
    else if (a == "--steps") f.steps = std::stoi(next());
    else if (a == "--depth") f.depth = std::stoi(next());
    else if (a == "--write-buffer-mib") f.write_buffer_mib = std::stoul(next());
    else if (a == "--no-fio") f.fio = false;
    else if (a == "--store") f.store = next();
    else if (a == "--rounds") f.rounds = std::stoi(next());
    else if (a == "--write-threads") f.write_threads = std::stoi(next());
    else Usage(("unknown flag " + a).c_str());
  }
  if (f.chunk_mib == 0 || f.state_mib < f.chunk_mib || f.steps < 1 || f.depth < 1 || f.rounds < 1) Usage("bad sizes");
  if (f.store != "rocksdb" && f.store != "valuelog" && f.store != "both") Usage("--store: rocksdb, valuelog or both");
  return f;
}

// Writes back and drops the page cache of every file in dir, so reads come from the drive.
void EvictPageCache(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// fio's bandwidth (bytes/s) of one sequential job on `file`, or -1. Buffered I/O, 1 MiB blocks,
// fsync at the end of the write job (the store's Commit is durable too); fio drops the file's
// page cache before the read job (invalidate=1).
// direct: O_DIRECT instead (--direct=1), the value-log store's own kind of I/O.
double Fio(const std::string& rw, const std::string& file, size_t mib, bool direct = false) {
  const std::string cmd = "fio --name=raw --filename=" + file + " --rw=" + rw + " --bs=1M --size=" +
                          std::to_string(mib) + "M --ioengine=psync --end_fsync=1 --invalidate=1 " +
                          (direct ? "--direct=1 " : "") +
                          "--output-format=terse --terse-version=3 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) return -1;
  // Terse v3: field 7 is read bandwidth (KiB/s), field 48 write bandwidth (KiB/s) (1-based).
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t pos; (pos = out.find(';', start)) != std::string::npos; start = pos + 1)
    fields.push_back(out.substr(start, pos - start));
  const size_t idx = rw == "read" ? 6 : 47;
  if (fields.size() <= idx) return -1;
  return std::stod(fields[idx]) * 1024.0;
}

void Check(const traind::Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "offload_bench: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// Writes, reads and updates the state in the store `kind` in store_dir; prints its rows and its
// RESULT line; removes store_dir. Returns its write+commit and read bandwidth.
Bandwidths RunStore(const std::string& kind, const Flags& f, const std::string& store_dir, size_t nchunks, size_t chunk,
              double state, double fio_write, double fio_read, double fio_dwrite, double fio_dread) {
  const double mb = 1e6;
  fs::remove_all(store_dir);
  traind::offload::StoreOptions o;
  o.write_buffer_bytes = f.write_buffer_mib << 20;
  if (f.write_threads > 0) o.write_threads = f.write_threads;
  o.max_chunk_bytes = std::max(o.max_chunk_bytes, chunk);
  o.max_pending_write_bytes = std::max(o.max_pending_write_bytes, 4 * chunk);
  o.max_prefetch_bytes = std::max(o.max_prefetch_bytes, static_cast<size_t>(f.depth + 1) * chunk);
  auto opened = kind == "valuelog" ? traind::offload::MakeValueLogStore(store_dir, o)
                                   : traind::offload::MakeRocksDbStore(store_dir, o);
  Check(opened.status(), "open");
  auto& store = *opened;

  std::vector<StateKey> keys;
  for (size_t i = 0; i < nchunks; ++i) keys.push_back({"g0", static_cast<int64_t>(i / 3), i % 3 == 0 ? "master" : i % 3 == 1 ? "exp_avg" : "exp_avg_sq"});
  std::vector<char> buf(chunk);
  for (size_t i = 0; i < chunk; ++i) buf[i] = static_cast<char>(i * 2654435761u >> 13);

  // 2. Write + commit: every chunk every step (steady state = steps after the first).
  double write_s = 0, commit_s = 0;
  int timed_steps = 0;
  for (int step = 0; step < f.steps; ++step) {
    const auto t0 = Clock::now();
    for (const auto& k : keys) {
      buf[0] = static_cast<char>(step);
      Check(store->Write(k, buf.data(), chunk), "write");
    }
    const auto t1 = Clock::now();
    Check(store->Commit(step), "commit");
    if (step > 0 || f.steps == 1) {
      write_s += Since(t0);
      commit_s += Since(t1);
      ++timed_steps;
    }
  }
  const double write_bw = state * timed_steps / write_s;

  // 3. Read with read-ahead, page cache dropped first.
  EvictPageCache(store_dir);
  auto t0 = Clock::now();
  for (size_t i = 0; i < std::min<size_t>(f.depth, keys.size()); ++i) store->Prefetch(keys[i]);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + f.depth < keys.size()) store->Prefetch(keys[i + f.depth]);
    Check(store->Read(keys[i], buf.data(), chunk), "read");
  }
  const double read_bw = state / Since(t0);

  // 4. One optimizer-like pass: read-ahead, update, write-behind, commit (page cache dropped).
  EvictPageCache(store_dir);
  t0 = Clock::now();
  for (size_t i = 0; i < std::min<size_t>(f.depth, keys.size()); ++i) store->Prefetch(keys[i]);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + f.depth < keys.size()) store->Prefetch(keys[i + f.depth]);
    Check(store->Read(keys[i], buf.data(), chunk), "read");
    buf[1] ^= 1;  // the "update"
    Check(store->Write(keys[i], buf.data(), chunk), "write");
  }
  Check(store->Commit(f.steps), "commit");
  const double pass_s = Since(t0);

  const auto s = store->Stats();
  const double wa = double(s.device_written_bytes) / double(s.written_bytes);
  std::printf("store %s (%s):\n", kind.c_str(), store->Describe().c_str());
  std::printf("  store write+commit: %8.1f MB/s%s  (commit %.0f ms/step of %.0f ms)\n", write_bw / mb,
              fio_write > 0 ? (" = " + std::to_string(int(100 * write_bw / fio_write)) + "% of fio").c_str() : "",
              1000 * commit_s / timed_steps, 1000 * write_s / timed_steps);
  std::printf("  store read (read-ahead %d chunks): %8.1f MB/s%s\n", f.depth, read_bw / mb,
              fio_read > 0 ? (" = " + std::to_string(int(100 * read_bw / fio_read)) + "% of fio").c_str() : "");
  if (fio_dwrite > 0)
    std::printf("  (of fio with O_DIRECT: write+commit %d%%, read %d%%)\n", int(100 * write_bw / fio_dwrite),
                int(100 * read_bw / fio_dread));
  std::printf("  optimizer pass (read+update+write+commit): %.2f s for %.0f MiB each way (%.1f MB/s each way)\n",
              pass_s, state / 1048576.0, state / pass_s / mb);
  std::printf("  write amplification: %.3f (%.1f MiB to files for %.1f MiB of state; %s)\n",
              wa, s.device_written_bytes / 1048576.0, s.written_bytes / 1048576.0,
              kind == "valuelog" ? "segment writes + index flush/compaction/WAL bytes" : "RocksDB flush+compaction+WAL bytes");
  std::printf("  caller wait %.2f s, background I/O %.2f s, prefetch hits %llu misses %llu, on disk %.1f MiB\n",
              s.io_wait_seconds, s.background_io_seconds, static_cast<unsigned long long>(s.prefetch_hits),
              static_cast<unsigned long long>(s.prefetch_misses), s.store_bytes / 1048576.0);
  std::printf("RESULT side=offload write_mbps=%.1f read_mbps=%.1f fio_write_mbps=%.1f fio_read_mbps=%.1f "
              "write_ratio=%.2f read_ratio=%.2f write_amp=%.3f store=%s fio_direct_write_mbps=%.1f "
              "fio_direct_read_mbps=%.1f\n",
              write_bw / mb, read_bw / mb, fio_write / mb, fio_read / mb,
              fio_write > 0 ? write_bw / fio_write : 0.0, fio_read > 0 ? read_bw / fio_read : 0.0, wa, kind.c_str(),
              fio_dwrite / mb, fio_dread / mb);
  store.reset();
  fs::remove_all(store_dir);
  return {write_bw, read_bw};
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = Parse(argc, argv);
  bool own_dir = false;
  if (f.dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/offload_bench_XXXXXX";
    if (!::mkdtemp(tmpl.data())) Usage("cannot create a temporary directory");
    f.dir = tmpl;
    own_dir = true;
  }
  fs::create_directories(f.dir);
  const std::string store_dir = f.dir + "/offload_bench_store";
  const std::string fio_file = f.dir + "/offload_bench_fio.tmp";
  fs::remove_all(store_dir);
  const size_t chunk = f.chunk_mib << 20;
  const size_t nchunks = f.state_mib / f.chunk_mib;
  const double state = double(nchunks * chunk);
  const double mb = 1e6;

  std::vector<std::string> kinds;
  if (f.store != "valuelog") kinds.push_back("rocksdb");
  if (f.store != "rocksdb") kinds.push_back("valuelog");
  std::vector<double> raw_write, raw_read;                       // per round: the faster fio mode
  std::vector<std::vector<double>> store_write(kinds.size()), store_read(kinds.size());
  for (int round = 0; round < f.rounds; ++round) {
    // 1. Raw sequential bandwidth of the directory, same run, same sizes.
    double fio_write = -1, fio_read = -1, fio_dwrite = -1, fio_dread = -1;
    if (f.fio) {
      fio_write = Fio("write", fio_file, nchunks * f.chunk_mib);
      fio_read = Fio("read", fio_file, nchunks * f.chunk_mib);
      fs::remove(fio_file);
      fio_dwrite = Fio("write", fio_file, nchunks * f.chunk_mib, /*direct=*/true);
      fio_dread = Fio("read", fio_file, nchunks * f.chunk_mib, /*direct=*/true);
      fs::remove(fio_file);
      if (fio_write < 0 || fio_read < 0) std::fprintf(stderr, "offload_bench: fio did not run (is it installed?)\n");
      raw_write.push_back(std::max(fio_write, fio_dwrite));
      raw_read.push_back(std::max(fio_read, fio_dread));
    }

    std::printf("offload_bench dir=%s state=%.0f MiB chunk=%zu MiB steps=%d round %d of %d\n", f.dir.c_str(),
                state / 1048576.0, f.chunk_mib, f.steps, round + 1, f.rounds);
    if (fio_write > 0)
      std::printf("  fio seq write (1 MiB, buffered, fsync at end): %8.1f MB/s\n"
                  "  fio seq read  (1 MiB, page cache dropped):     %8.1f MB/s\n"
                  "  fio seq write / read with O_DIRECT (--direct=1): %.1f / %.1f MB/s\n",
                  fio_write / mb, fio_read / mb, fio_dwrite / mb, fio_dread / mb);
    for (size_t k = 0; k < kinds.size(); ++k) {
      const Bandwidths bw =
          RunStore(kinds[k], f, store_dir, nchunks, chunk, state, fio_write, fio_read, fio_dwrite, fio_dread);
      store_write[k].push_back(bw.write);
      store_read[k].push_back(bw.read);
    }
  }

  // Medians over the rounds, against the raw bandwidth (the faster fio mode of each direction).
  const double raw_w = Median(raw_write), raw_r = Median(raw_read);
  if (f.rounds > 1 || f.fio) {
    std::printf("medians of %d round%s (raw = the faster fio mode, buffered or O_DIRECT, per round):\n", f.rounds,
                f.rounds == 1 ? "" : "s");
    if (raw_w > 0) std::printf("  raw write %.1f MB/s, raw read %.1f MB/s\n", raw_w / mb, raw_r / mb);
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const double w = Median(store_write[k]), r = Median(store_read[k]);
    const double wr = raw_w > 0 ? w / raw_w : 0, rr = raw_r > 0 ? r / raw_r : 0;
    if (raw_w > 0)
      std::printf("  %-8s write+commit %.1f MB/s = %.0f%% of raw (%s), read %.1f MB/s = %.0f%% of raw (%s); "
                  "target >= 80%%\n",
                  kinds[k].c_str(), w / mb, 100 * wr, wr >= 0.8 ? "met" : "NOT MET", r / mb, 100 * rr,
                  rr >= 0.8 ? "met" : "NOT MET");
    std::printf("SUMMARY store=%s rounds=%d write_mbps=%.1f read_mbps=%.1f raw_write_mbps=%.1f raw_read_mbps=%.1f "
                "write_of_raw=%.2f read_of_raw=%.2f\n",
                kinds[k].c_str(), f.rounds, w / mb, r / mb, raw_w / mb, raw_r / mb, wr, rr);
  }
  if (own_dir) fs::remove_all(f.dir);
  return 0;
}
