// `trainctl top`: a live view of all the caller's jobs, like htop: one row per job (id, name,
// owner, state, step/max, loss, tokens/s, ETA), redrawn every --interval seconds; q quits. When
// stdout is not a terminal, or with --once, it prints one frame and exits (-o json: one object
// {"jobs":[...]} per frame).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "traind/client/client.h"

namespace traind::trainctl {

struct TopOptions {
  double interval_seconds = 2;
  bool once = false;
  bool json = false;
  std::string addr;  // shown in the header
};

// One row of the view: the job record plus figures from its newest events.
struct TopRow {
  v1::Job job;
  double loss = 0;               // newest step loss (the run's train_loss once SUCCEEDED); NaN: none
  double tokens_per_second = 0;  // newest logging window (SUCCEEDED: the run's)
  double eta_seconds = -1;       // RUNNING: remaining steps x mean recent step time; else -1
};

// Rows of every job the caller may see, newest first (events read for started jobs only).
Result<std::vector<TopRow>> CollectTopRows(client::Client& c);
// The text frame: a header line and an aligned table, each line cut to `width` columns (0 = no cut);
// `live` adds the "q quits" hint.
std::string TopFrame(const std::vector<TopRow>& rows, const std::string& addr, int width, bool live);
nlohmann::json TopJson(const std::vector<TopRow>& rows);

// Runs the view until q (or Ctrl-C, or one frame); errors from traind end it.
Status RunTop(client::Client& c, const TopOptions& options);

}  // namespace traind::trainctl
