// `trainctl top` (see top.h). The table is drawn with ANSI escapes on the alternate screen; the
// terminal is put in non-canonical, no-echo mode to read q, and restored on every way out.
#include "top.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>

#include "job_state.h"

namespace traind::trainctl {

namespace {

constexpr int64_t kEventWindow = 64;  // newest events behind tokens/s and ETA
constexpr int kStepWindow = 20;       // step times averaged for the ETA

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "1:02:03" / "4:05"; "-" when unknown.
std::string Duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[64];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                               static_cast<long long>(s % 3600 / 60), static_cast<long long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

volatile std::sig_atomic_t g_stop = 0;
void OnStopSignal(int) { g_stop = 1; }

// Raw-ish terminal for the live view; the destructor restores everything.
class Screen {
 public:
  Screen() {
    if (::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      restore_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::cout << "\033[?1049h\033[?25l" << std::flush;  // alternate screen, hide the cursor
  }
  ~Screen() {
    std::cout << "\033[?25h\033[?1049l" << std::flush;
    if (restore_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  static void Size(int* cols, int* rows) {
    winsize ws{};
    *cols = 0;
    *rows = 0;
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
      *cols = ws.ws_col;
      *rows = ws.ws_row;
    }
  }

 private:
  termios saved_{};
  bool restore_ = false;
};

// Waits up to `seconds` for a key; true when q/Q (or a stop signal) asks to quit.
bool WaitForQuit(double seconds) {
  const auto deadline_ms = static_cast<int>(seconds * 1000);
  int waited = 0;
  while (waited < deadline_ms && !g_stop) {
    const int step = std::min(100, deadline_ms - waited);
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int r = ::isatty(STDIN_FILENO) ? ::poll(&p, 1, step) : (::usleep(static_cast<useconds_t>(step) * 1000), 0);
    if (r > 0 && (p.revents & POLLIN)) {
      char ch = 0;
      if (::read(STDIN_FILENO, &ch, 1) == 1 && (ch == 'q' || ch == 'Q')) return true;
    }
    waited += step;
  }
  return g_stop != 0;
}

}  // namespace

Result<std::vector<TopRow>> CollectTopRows(client::Client& c) {
  TRAIND_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, c.List());
  std::vector<TopRow> rows;
  for (auto& job : jobs) {
    TopRow row;
    row.loss = job.step() > 0 ? job.last_loss() : NAN;
    if (job.state() != v1::JOB_STATE_QUEUED && job.last_sequence() > 0) {
      std::vector<v1::JobEvent> events;
      Status s = c.Watch(job.id(), std::max<int64_t>(1, job.last_sequence() - kEventWindow + 1), false,
                         [&](const v1::JobEvent& ev) {
                           events.push_back(ev);
                           return true;
                         });
      if (!s.ok() && s.code() != Status::Code::kNotFound) return s;
      double secs = 0;
      int n = 0;
      for (auto it = events.rbegin(); it != events.rend(); ++it) {
        if (it->has_log() && row.tokens_per_second == 0) row.tokens_per_second = it->log().tokens_per_second();
        if (it->has_step() && n < kStepWindow && it->step().step_seconds() > 0) {
          secs += it->step().step_seconds();
          ++n;
        }
      }
      if (job.state() == v1::JOB_STATE_RUNNING && n > 0 && job.max_steps() > 0)
        row.eta_seconds = static_cast<double>(std::max<int64_t>(0, job.max_steps() - job.step())) * secs / n;
    }
    if (job.has_summary()) {
      row.loss = job.summary().train_loss();
      if (job.summary().train_tokens_per_second() > 0) row.tokens_per_second = job.summary().train_tokens_per_second();
    }
    row.job = std::move(job);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string TopFrame(const std::vector<TopRow>& rows, const std::string& addr, int width, bool live) {
  std::map<std::string, int> counts;
  for (const auto& r : rows) counts[v1::JobStateName(r.job.state())]++;
  std::ostringstream head;
  const std::time_t now = std::time(nullptr);
  char clock[32];
  std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
  head << "trainctl top - traind " << addr << " - " << clock << " - " << rows.size() << " jobs";
  for (const auto& [state, n] : counts) head << ", " << n << " " << state;
  if (live) head << "   (q quits)";

  const std::vector<std::string> header = {"ID", "NAME", "OWNER", "STATE", "STEP", "LOSS", "TOK/S", "ETA"};
  std::vector<std::vector<std::string>> table = {header};
  for (const auto& r : rows) {
    const auto& j = r.job;
    table.push_back({j.id(), j.name(), j.owner(), v1::JobStateName(j.state()),
                     std::to_string(j.step()) + "/" + std::to_string(j.max_steps()), Fixed(r.loss, 4),
                     r.tokens_per_second > 0 ? Fixed(r.tokens_per_second, 0) : "-", Duration(r.eta_seconds)});
  }
  std::vector<size_t> w(header.size(), 0);
  for (const auto& row : table)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  const std::vector<bool> right = {false, false, false, false, true, true, true, true};
  std::ostringstream out;
  auto emit = [&](const std::string& line) {
    out << (width > 0 && static_cast<int>(line.size()) > width ? line.substr(0, static_cast<size_t>(width)) : line) << "\n";
  };
  emit(head.str());
  emit("");
  for (const auto& row : table) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(w[i] - row[i].size(), ' ');
      line += right[i] ? pad + row[i] : row[i] + pad;
      if (i + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    emit(line);
  }
  if (rows.empty()) emit("no jobs (trainctl submit JOB.yaml)");
  return out.str();
}

nlohmann::json TopJson(const std::vector<TopRow>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const auto& r : rows) {
    const auto& j = r.job;
    arr.push_back({{"id", j.id()}, {"name", j.name()}, {"owner", j.owner()}, {"state", v1::JobStateName(j.state())},
                   {"step", j.step()}, {"max_steps", j.max_steps()}, {"loss", num(r.loss)},
                   {"tokens_per_second", num(r.tokens_per_second)},
                   {"eta_seconds", r.eta_seconds >= 0 ? num(r.eta_seconds) : nlohmann::json(nullptr)}});
  }
  return {{"jobs", arr}};
}

Status RunTop(client::Client& c, const TopOptions& o) {
  const bool live = !o.once && ::isatty(STDOUT_FILENO) && !o.json;
  if (!live) {
    TRAIND_ASSIGN_OR_RETURN(std::vector<TopRow> rows, CollectTopRows(c));
    if (o.json) std::cout << TopJson(rows).dump() << std::endl;
    else std::cout << TopFrame(rows, o.addr, 0, false) << std::flush;
    return Status::Ok();
  }
  if (!(o.interval_seconds > 0)) return Status::InvalidArgument("--interval must be positive");
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  Screen screen;
  while (!g_stop) {
    auto rows = CollectTopRows(c);
    if (!rows.ok()) return rows.status();  // Screen restores the terminal first
    int cols = 0, lines = 0;
    Screen::Size(&cols, &lines);
    std::string frame = TopFrame(*rows, o.addr, cols, true);
    if (lines > 0) {  // keep to the window: drop the rows that do not fit
      size_t pos = 0;
      for (int i = 0; i < lines - 1 && pos != std::string::npos; ++i) pos = frame.find('\n', pos + 1);
      if (pos != std::string::npos) frame = frame.substr(0, pos + 1);
    }
    std::cout << "\033[H\033[2J" << frame << std::flush;
    if (WaitForQuit(o.interval_seconds)) break;
  }
  return Status::Ok();
}

}  // namespace traind::trainctl
