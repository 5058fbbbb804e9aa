// trainctl: the command-line client of traind (docs/cli.md). Exit codes: 0 success;
// 1 the job failed or was cancelled (with --wait/--follow); 2 usage or invalid spec; 3 traind
// cannot be reached or refused the token. Errors go to stderr as one sentence.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <vector>
#include <iostream>

#include "format.h"
#include "top.h"
#include "job_state.h"
#include "traind/client/client.h"
#include "traind/engine/spec_examples.h"
#include "traind/engine/tokenizer.h"

namespace {

using traind::Result;
using traind::Status;
using namespace traind::trainctl;
namespace v1 = traind::v1;

struct Globals {
  std::string addr, token, token_file, state_dir = "./.traind", output = "text", tls_ca;
  bool tls = false;
  double timeout = 30;
};

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case Status::Code::kUnavailable:
    case Status::Code::kUnauthenticated:
    case Status::Code::kPermissionDenied: return 3;
    case Status::Code::kInvalidArgument:
    case Status::Code::kFailedPrecondition:
    case Status::Code::kNotFound:
    case Status::Code::kUnimplemented: return 2;
    default: return 1;
  }
}

// The error as one sentence (without the "trainctl: " prefix).
std::string ErrorText(const Globals& g, const Status& s) {
  std::string m = s.message();
  switch (s.code()) {
    case Status::Code::kUnavailable: m = "cannot reach traind at " + g.addr + ": " + m; break;
    case Status::Code::kUnauthenticated: m = "traind at " + g.addr + " did not accept the token: " + m; break;
    default: break;
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

int Error(const Globals& g, const Status& s) {
  std::fprintf(stderr, "trainctl: %s\n", ErrorText(g, s).c_str());
  return ExitCodeFor(s);
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

// Follows a job's events to its end: a progress bar on a terminal (text mode), plain lines
// otherwise, one JSON object per event with -o json. Returns the final job.
Result<v1::Job> Follow(traind::client::Client& c, const Globals& g, const std::string& id, bool bar,
                       bool quiet = false) {
  const bool json = g.output == "json";
  const bool tty = bar && !json && ::isatty(STDOUT_FILENO);
  Progress progress;
  bool bar_shown = false;
  Status s = c.Watch(id, 1, true, [&](const v1::JobEvent& ev) {
    if (quiet) return true;
    if (json) {
      PrintJson(EventJson(ev));
      return true;
    }
    if (tty && ev.has_step()) {
      progress.Update(ev.step());
      std::cout << "\r\033[2K" << progress.Line() << std::flush;
      bar_shown = true;
      return true;
    }
    if (tty && bar_shown) std::cout << "\r\033[2K";
    std::cout << EventText(ev) << "\n";
    if (tty && bar_shown) std::cout << progress.Line();
    std::cout << std::flush;
    return true;
  });
  if (tty && bar_shown) std::cout << "\n";
  if (!s.ok()) return s;
  return c.Get(id);
}

Result<std::string> ResolveToken(const Globals& g) {
  if (!g.token.empty()) return g.token;
  std::string file = g.token_file;
  if (file.empty()) {
    if (const char* env = std::getenv("TRAIND_TOKEN"); env && *env) return std::string(env);
    file = g.state_dir + "/token";
  }
  auto text = traind::client::ReadFile(file);
  if (!text.ok()) {
    if (!g.token_file.empty()) return Status::Unauthenticated("cannot read the token file " + file);
    return std::string();  // none: traind will say UNAUTHENTICATED
  }
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

// `tokenize`: local, no traind. The engine's tokenizers (byte, a tokenizer.json, a SentencePiece
// .model, or a folder holding one; JOBSPEC.md data.tokenizer) give the ids the engine trains on.
int Tokenize(const std::string& tokenizer, const std::string& text, const std::string& file,
             bool from_file, bool json) {
  auto tok = traind::engine::DefaultTokenizerFactory().Open(tokenizer, "");
  if (!tok.ok()) {
    std::fprintf(stderr, "trainctl: %s\n", tok.status().message().c_str());
    return 2;
  }
  std::string input = text;
  if (from_file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "trainctl: cannot read %s\n", file.c_str());
      return 2;
    }
    input.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto ids = (*tok)->EncodeLarge(input, 2);
  if (!ids.ok()) {
    std::fprintf(stderr, "trainctl: %s\n", ids.status().message().c_str());
    return 2;
  }
  if (json) {
    PrintJson({{"ids", *ids}});
  } else {
    std::string line;
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i) line += ' ';
      line += std::to_string((*ids)[i]);
    }
    std::cout << line << "\n";
  }
  return 0;
}

// `tokenize --spec JOB.yaml [--examples N]`: local, no traind. The spec's first N training
// examples as the job sees them (paths resolved against the working directory, as submit does).
int TokenizeSpec(const std::string& spec_path, int64_t n, bool json) {
  auto text = traind::client::ReadFile(spec_path);
  if (!text.ok()) {
    std::fprintf(stderr, "trainctl: cannot read the job spec %s\n", spec_path.c_str());
    return 2;
  }
  if (n < 0) {
    std::fprintf(stderr, "trainctl: --examples must be >= 0, got %lld\n", static_cast<long long>(n));
    return 2;
  }
  auto spec = traind::engine::ParseJobSpec(*text, std::filesystem::current_path().string());
  if (!spec.ok()) {
    std::fprintf(stderr, "trainctl: %s\n", spec.status().message().c_str());
    return 2;
  }
  auto examples = traind::engine::SpecTrainingExamples(*spec, n);
  if (!examples.ok()) {
    std::fprintf(stderr, "trainctl: %s\n", examples.status().message().c_str());
    return 2;
  }
  if (json) {
    nlohmann::ordered_json out = {{"examples", nlohmann::ordered_json::array()}};
    for (const auto& e : *examples) {
      out["examples"].push_back(
          {{"text", e.text}, {"input_ids", e.input_ids}, {"labels", e.labels}});
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return 0;
  }
  auto join = [](const std::vector<int32_t>& v) {
    std::string line;
    for (size_t i = 0; i < v.size(); ++i) line += (i ? " " : "") + std::to_string(v[i]);
    return line;
  };
  for (size_t i = 0; i < examples->size(); ++i) {
    const auto& e = (*examples)[i];
    int64_t with_loss = 0;
    for (int32_t l : e.labels) with_loss += l != -100 ? 1 : 0;
    if (i) std::cout << "\n";
    std::cout << "example " << (i + 1) << ": " << e.input_ids.size() << " tokens, " << with_loss
              << " with loss\n"
              << "text: "
              << nlohmann::json(e.text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n"
              << "input_ids: " << join(e.input_ids) << "\n"
              << "labels: " << join(e.labels) << "   (-100: no loss)\n";
  }
  if (examples->empty()) std::cout << "no training examples\n";
  return 0;
}

// `submit JOB.yaml --hosts H1:P,H2:P,...`: one data-parallel run, rank i on the daemon at host i
// (docs/distributed.md). The spec is read once; each rank's copy gets distributed: {world_size,
// rank, master_addr (host 0's, unless the spec names one), master_port (the spec's, else a free
// port of this machine when host 0 is a loopback address, else 29400)} and the run's id.
struct HostsSubmit {
  std::string spec_path, hosts;
  int priority = 0;
  bool wait = false, follow = false;
};

bool IsLoopbackHost(const std::string& h) {
  return h == "localhost" || h == "::1" || h == "[::1]" || h.rfind("127.", 0) == 0;
}

// A TCP port the kernel has free now (bind :0); 0 when none.
int FreeLocalPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::string NewRunId() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "run-%012llx", static_cast<unsigned long long>(v & 0xffffffffffffULL));
  return buf;
}

int Usage(const std::string& m) {
  std::fprintf(stderr, "trainctl: %s\n", m.c_str());
  return 2;
}

int SubmitHosts(Globals g, const std::string& token, const HostsSubmit& h) {
  const bool json = g.output == "json";
  std::vector<std::string> hosts;
  std::set<std::string> seen;
  for (size_t start = 0; start <= h.hosts.size();) {
    size_t comma = h.hosts.find(',', start);
    if (comma == std::string::npos) comma = h.hosts.size();
    std::string one = h.hosts.substr(start, comma - start);
    while (!one.empty() && one.front() == ' ') one.erase(one.begin());
    while (!one.empty() && one.back() == ' ') one.pop_back();
    const size_t colon = one.rfind(':');
    if (one.empty() || colon == std::string::npos || colon == 0 || colon + 1 == one.size()) {
      return Usage("--hosts: expected HOST:PORT,HOST:PORT,..., got '" + one + "' in '" + h.hosts + "'");
    }
    if (!seen.insert(one).second) {
      return Usage("--hosts: " + one + " appears twice; each rank needs its own daemon");
    }
    hosts.push_back(one);
    start = comma + 1;
  }
  auto text = traind::client::ReadFile(h.spec_path);
  if (!text.ok()) return Usage(text.status().message());
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    return Usage(h.spec_path + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) return Usage(h.spec_path + ": a job spec is a YAML mapping");
  YAML::Node dist = root["distributed"];
  if (dist && !dist.IsNull() && !dist.IsMap()) {
    return Usage("distributed: expected a mapping {world_size, rank, master_addr, master_port}");
  }
  std::string master_addr = hosts[0].substr(0, hosts[0].rfind(':'));
  if (master_addr.size() > 2 && master_addr.front() == '[' && master_addr.back() == ']') {
    master_addr = master_addr.substr(1, master_addr.size() - 2);
  }
  int64_t master_port = 0;
  try {
    if (dist && dist.IsMap() && dist["master_addr"] && !dist["master_addr"].IsNull()) {
      master_addr = dist["master_addr"].as<std::string>();
    }
    if (dist && dist.IsMap() && dist["master_port"] && !dist["master_port"].IsNull()) {
      master_port = dist["master_port"].as<int64_t>();
    }
  } catch (const YAML::Exception& e) {
    return Usage(std::string("distributed: ") + e.what());
  }
  if (master_port == 0) master_port = IsLoopbackHost(master_addr) ? FreeLocalPort() : 29400;
  if (master_port <= 0) master_port = 29400;
  const std::string run_id = NewRunId();
  const std::string base_dir = std::filesystem::current_path().string();

  struct Rank {
    std::string host, id;
    std::unique_ptr<traind::client::Client> client;
  };
  std::vector<Rank> ranks;
  // Cancels the ranks already submitted; "; cancelled rank 0 (job-000001 at H)".
  auto cancel_submitted = [&]() {
    std::string done;
    for (size_t r = 0; r < ranks.size(); ++r) {
      auto c = ranks[r].client->Cancel(ranks[r].id);
      done += std::string(done.empty() ? "" : ", ") + "rank " + std::to_string(r) + " (" + ranks[r].id +
              " at " + ranks[r].host + (c.ok() ? ")" : ": the cancel failed: " + c.status().message() + ")");
    }
    return done.empty() ? std::string() : "; cancelled " + done;
  };
  for (size_t i = 0; i < hosts.size(); ++i) {
    YAML::Node copy = YAML::Clone(root);
    YAML::Node d = copy["distributed"];
    if (!d || !d.IsMap()) d = YAML::Node(YAML::NodeType::Map);
    d["world_size"] = static_cast<int64_t>(hosts.size());
    d["rank"] = static_cast<int64_t>(i);
    d["master_addr"] = master_addr;
    d["master_port"] = master_port;
    copy["distributed"] = d;
    YAML::Emitter out;
    out << copy;
    traind::client::ClientOptions co;
    co.addr = hosts[i];
    co.token = token;
    co.tls = g.tls || !g.tls_ca.empty();
    co.tls_ca_file = g.tls_ca;
    co.timeout_seconds = g.timeout;
    g.addr = hosts[i];
    auto client = traind::client::Client::Create(co);
    v1::SubmitJobRequest req;
    req.set_spec_yaml(std::string(out.c_str()));
    req.set_base_dir(base_dir);
    req.set_priority(h.priority);
    req.set_run_id(run_id);
    Result<v1::Job> job = client.ok() ? (*client)->Submit(req) : Result<v1::Job>(client.status());
    if (!job.ok()) {
      std::fprintf(stderr, "trainctl: rank %zu of %zu (%s): %s%s\n", i, hosts.size(), hosts[i].c_str(),
                   ErrorText(g, job.status()).c_str(), cancel_submitted().c_str());
      return ExitCodeFor(job.status());
    }
    ranks.push_back({hosts[i], job->id(), std::move(*client)});
  }
  auto jobs_json = [&](const std::vector<v1::Job>* ends) {
    nlohmann::json arr = nlohmann::json::array();
    for (size_t r = 0; r < ranks.size(); ++r) {
      nlohmann::json o = {{"host", ranks[r].host}, {"id", ranks[r].id}, {"rank", r}};
      if (ends) {
        o["state"] = v1::JobStateName((*ends)[r].state());
        o["error"] = (*ends)[r].error();
      }
      arr.push_back(o);
    }
    return nlohmann::json{{"jobs", arr}, {"run_id", run_id}, {"world_size", ranks.size()},
                          {"master", master_addr + ":" + std::to_string(master_port)}};
  };
  if (!json || (!h.wait && !h.follow)) {
    if (json) {
      PrintJson(jobs_json(nullptr));
    } else {
      for (const auto& r : ranks) std::cout << r.host << " " << r.id << "\n";
      std::cout << std::flush;
    }
  }
  if (!h.wait && !h.follow) return 0;
  // Rank 0's progress (with --follow), then every rank to its end.
  std::vector<v1::Job> ends(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    g.addr = ranks[r].host;
    Result<v1::Job> end = Follow(*ranks[r].client, g, ranks[r].id, r == 0, /*quiet=*/!(h.follow && r == 0));
    if (!end.ok()) {
      std::fprintf(stderr, "trainctl: rank %zu (%s at %s): %s\n", r, ranks[r].id.c_str(), ranks[r].host.c_str(),
                   ErrorText(g, end.status()).c_str());
      return ExitCodeFor(end.status());
    }
    ends[r] = *end;
  }
  bool all_ok = true;
  std::string failed;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ends[r].state() == v1::JOB_STATE_SUCCEEDED) continue;
    all_ok = false;
    if (failed.empty()) {
      failed = "rank " + std::to_string(r) + " (" + ranks[r].id + " at " + ranks[r].host + ") " +
               v1::JobStateName(ends[r].state()) + (ends[r].error().empty() ? "" : ": " + ends[r].error());
    }
  }
  if (json) {
    PrintJson(jobs_json(&ends));
  } else {
    std::ostream& o = h.follow ? std::cout : std::cerr;
    for (size_t r = 0; r < ranks.size(); ++r) {
      o << ranks[r].host << " " << ranks[r].id << " rank " << r << " " << v1::JobStateName(ends[r].state());
      if (!ends[r].error().empty()) o << ": " << ends[r].error();
      if (r == 0 && ends[r].state() == v1::JOB_STATE_SUCCEEDED) o << "; model in " << ends[r].output_dir();
      o << "\n";
    }
    o << std::flush;
  }
  if (!all_ok) std::fprintf(stderr, "trainctl: the run failed: %s\n", failed.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Globals g;
  if (const char* env = std::getenv("TRAIND_ADDR"); env && *env) g.addr = env;
  else g.addr = "127.0.0.1:50051";
  CLI::App app{"trainctl: submit and follow training jobs on traind"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the command: `trainctl status ID -o json`
  app.add_option("--addr", g.addr, "traind host:port (env TRAIND_ADDR)");
  app.add_option("--token", g.token, "bearer token (env TRAIND_TOKEN)");
  app.add_option("--token-file", g.token_file, "file holding the token");
  app.add_option("--state-dir", g.state_dir, "traind's state dir (its token file is used by default)");
  app.add_option("-o,--output", g.output, "text | json")->check(CLI::IsMember({"text", "json"}));
  app.add_flag("--tls", g.tls, "connect with TLS");
  app.add_option("--tls-ca", g.tls_ca, "PEM CA certificates for --tls");
  app.add_option("--timeout", g.timeout, "seconds per call");

  std::string spec, id;
  bool wait = false, follow = false, logs_follow = false;
  int priority = 0;
  auto* submit = app.add_subcommand("submit", "submit a job spec; prints the job id");
  submit->add_option("spec", spec, "JOB.yaml")->required();
  submit->add_flag("--wait", wait, "exit when the job ends (1 if it failed or was cancelled)");
  submit->add_flag("--follow", follow, "follow the job's progress to its end");
  submit->add_option("--priority", priority, "higher runs first (default 0)");
  std::string submit_hosts;
  submit->add_option("--hosts", submit_hosts,
                     "H1:P,H2:P,...: one data-parallel job, rank i on the daemon at host i (cpu daemons; "
                     "replaces the global address); prints 'host job-id' per rank; waiting follows rank 0 "
                     "and waits for every rank");
  auto* list = app.add_subcommand("list", "your jobs, newest first");
  auto* status = app.add_subcommand("status", "one job's state, metrics and plan");
  status->add_option("job_id", id, "JOB_ID")->required();
  auto* logs = app.add_subcommand("logs", "a job's events and step lines");
  logs->add_option("job_id", id, "JOB_ID")->required();
  logs->add_flag("-f,--follow", logs_follow, "follow with a progress bar and ETA");
  auto* cancel = app.add_subcommand("cancel", "cancel a job");
  cancel->add_option("job_id", id, "JOB_ID")->required();
  auto* estimate = app.add_subcommand("estimate", "memory plan by category and the batch it would choose");
  estimate->add_option("spec", spec, "JOB.yaml")->required();
  auto* health = app.add_subcommand("health", "is traind serving?");
  TopOptions top_opts;
  auto* top = app.add_subcommand("top", "live view of all your jobs (q quits); one frame when stdout is not a terminal");
  top->add_option("-n,--interval", top_opts.interval_seconds, "seconds between refreshes (default 2)");
  top->add_flag("--once", top_opts.once, "print one frame and exit");
  std::string tokenizer, tok_text, tok_file;
  auto* tokenize = app.add_subcommand("tokenize", "token ids of a text, computed locally");
  std::string tok_spec;
  int64_t tok_examples = 3;
  auto* tok_tokenizer_opt = tokenize->add_option(
      "--tokenizer", tokenizer, "byte | tokenizer.json | a .model | a folder (as data.tokenizer)");
  auto* tok_spec_opt = tokenize->add_option(
      "--spec", tok_spec, "JOB.yaml: its first training examples (text, ids, labels)");
  tok_spec_opt->excludes(tok_tokenizer_opt);
  auto* tok_examples_opt =
      tokenize->add_option("--examples", tok_examples, "with --spec: how many (default 3)");
  tok_examples_opt->needs(tok_spec_opt);
  auto* tok_text_opt = tokenize->add_option("text", tok_text, "TEXT");
  tok_text_opt->excludes(tok_spec_opt);
  v1::GenerateRequest gen;
  std::string gen_dir, gen_prompt, gen_chat, gen_tokenizer;
  int64_t gen_max_new = 64, gen_top_k = 0;
  double gen_temperature = 1.0, gen_top_p = 1.0;
  uint64_t gen_seed = 0;
  auto* generate = app.add_subcommand(
      "generate", "text from a trained model, run by traind on its device (prompt excluded)");
  generate->add_option("output_dir", gen_dir, "OUTPUT_DIR: a finished job's output_dir")->required();
  auto* gen_prompt_opt = generate->add_option("--prompt", gen_prompt, "the text to continue");
  generate
      ->add_option("--chat", gen_chat,
                   "instead of --prompt: a user message, rendered with the model's chat template "
                   "(add_generation_prompt); prints the answer")
      ->excludes(gen_prompt_opt);
  generate->add_option("--max-new-tokens", gen_max_new, "tokens to generate at most (default 64)");
  generate->add_option("--temperature", gen_temperature, "0 = greedy (default 1.0)");
  generate->add_option("--top-k", gen_top_k, "sample among the k likeliest; 1 = greedy, 0 = off (default)");
  generate->add_option("--top-p", gen_top_p, "nucleus sampling mass (default 1.0 = off)");
  generate->add_option("--seed", gen_seed, "sampling seed (default 0)");
  generate->add_option("--tokenizer", gen_tokenizer,
                       "as data.tokenizer (default: OUTPUT_DIR's tokenizer files, else byte)");
  tokenize->add_option("--file", tok_file, "read the text from F")
      ->excludes(tok_text_opt)
      ->excludes(tok_spec_opt);

  // One example per command in its --help (tests/daemon/help_test.sh checks every command has one).
  app.footer(
      "examples:\n"
      "  trainctl submit examples/tiny-shakespeare.yaml --follow\n"
      "  trainctl -o json status job-000001\n"
      "Exit codes: 0 ok; 1 the job failed or was cancelled (--wait); 2 usage or invalid spec;\n"
      "3 cannot reach or authenticate to traind.");
  submit->footer(
      "example: trainctl submit examples/tiny-shakespeare.yaml --wait   # exits 0 when it succeeds");
  list->footer("example: trainctl -o json list");
  status->footer("example: trainctl status job-000001   (-o json: state, metrics, plan)");
  logs->footer("example: trainctl logs job-000001 -f   # progress bar and ETA until the job ends");
  cancel->footer("example: trainctl cancel job-000001");
  estimate->footer(
      "example: trainctl estimate examples/tiny-shakespeare.yaml   # before submitting\n"
      "A job that does not fit: the plan it tried, each change that would make it fit with its bytes, exit 2.");
  health->footer("example: trainctl --addr 127.0.0.1:50051 health");
  top->footer("example: trainctl top -n 1   # q quits; trainctl top --once | grep RUNNING");
  tokenize->footer("example: trainctl tokenize --tokenizer byte 'To be, or not to be'\n"
                   "         trainctl tokenize --spec examples/instruct-chat.yaml --examples 2");
  generate->footer(
      "example: trainctl generate runs/tiny-shakespeare --prompt 'ROMEO:' --max-new-tokens 200\n"
      "         trainctl generate runs/instruct-chat --chat 'What is the capital of France?'\n"
      "-o json: {\"prompt\":..,\"text\":..,\"prompt_ids\":[..],\"ids\":[..],\"finish_reason\":..}");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "trainctl: %s (see trainctl --help)\n", e.what());
    return 2;
  }
  const bool json = g.output == "json";

  if (*tokenize && tokenize->count("--spec") > 0) return TokenizeSpec(tok_spec, tok_examples, json);
  if (*tokenize && tokenize->count("--tokenizer") == 0) {
    std::fprintf(stderr, "trainctl: tokenize needs --tokenizer T (TEXT | --file F) or --spec JOB.yaml "
                         "(see trainctl tokenize --help)\n");
    return 2;
  }
  if (*tokenize) return Tokenize(tokenizer, tok_text, tok_file, tokenize->count("--file") > 0, json);

  auto token = ResolveToken(g);
  if (!token.ok()) return Error(g, token.status());
  if (*submit && submit->count("--hosts") > 0) {
    if (app.count("--addr") > 0) return Usage("--addr and --hosts do not combine: --hosts names every daemon");
    HostsSubmit hs;
    hs.spec_path = spec;
    hs.hosts = submit_hosts;
    hs.priority = priority;
    hs.wait = wait;
    hs.follow = follow;
    return SubmitHosts(g, *token, hs);
  }
  traind::client::ClientOptions co;
  co.addr = g.addr;
  co.token = *token;
  co.tls = g.tls || !g.tls_ca.empty();
  co.tls_ca_file = g.tls_ca;
  co.timeout_seconds = g.timeout;
  auto client = traind::client::Client::Create(co);
  if (!client.ok()) return Error(g, client.status());
  auto& c = **client;

  if (*health) {
    Status s = c.Health();
    if (!s.ok()) return Error(g, s);
    if (json) PrintJson({{"status", "SERVING"}});
    else std::cout << "SERVING\n";
    return 0;
  }
  if (*top) {
    top_opts.json = json;
    top_opts.addr = g.addr;
    Status s = RunTop(c, top_opts);
    if (!s.ok()) return Error(g, s);
    return 0;
  }
  if (*submit) {
    auto job = c.SubmitFile(spec, priority);
    if (!job.ok()) return Error(g, job.status());
    if (!wait && !follow) {
      if (json) PrintJson(JobJson(*job));
      else std::cout << job->id() << "\n";
      return 0;
    }
    if (!json) std::cout << job->id() << std::endl;
    Result<v1::Job> end = Follow(c, g, job->id(), true, /*quiet=*/!follow);
    if (!end.ok()) return Error(g, end.status());
    if (json) {
      PrintJson(JobJson(*end));
    } else {
      // stdout keeps only the id (scripts capture it); the outcome line goes to stderr.
      std::ostream& o = follow ? std::cout : std::cerr;
      o << end->id() << " " << v1::JobStateName(end->state());
      if (!end->error().empty()) o << ": " << end->error();
      if (end->state() == v1::JOB_STATE_SUCCEEDED) o << "; model in " << end->output_dir();
      o << std::endl;
    }
    return end->state() == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
  }
  if (*list) {
    auto jobs = c.List();
    if (!jobs.ok()) return Error(g, jobs.status());
    if (json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& j : *jobs) arr.push_back(JobJson(j));
      PrintJson({{"jobs", arr}});
    } else {
      std::cout << ListText(*jobs);
    }
    return 0;
  }
  if (*status) {
    auto job = c.Get(id);
    if (!job.ok()) return Error(g, job.status());
    if (json) PrintJson(JobJson(*job));
    else std::cout << StatusText(*job);
    return 0;
  }
  if (*cancel) {
    auto job = c.Cancel(id);
    if (!job.ok()) return Error(g, job.status());
    if (json) PrintJson(JobJson(*job));
    else std::cout << "cancel requested for " << job->id() << " (" << v1::JobStateName(job->state()) << ")\n";
    return 0;
  }
  if (*logs) {
    if (logs_follow) {
      auto end = Follow(c, g, id, true);
      if (!end.ok()) return Error(g, end.status());
      return 0;
    }
    Status s = c.Watch(id, 1, false, [&](const v1::JobEvent& ev) {
      if (json) PrintJson(EventJson(ev));
      else std::cout << EventText(ev) << "\n";
      return true;
    });
    if (!s.ok()) return Error(g, s);
    return 0;
  }
  if (*generate) {
    const bool chat = generate->count("--chat") > 0;
    if (!chat && generate->count("--prompt") == 0) {
      return Usage("generate needs --prompt TEXT or --chat TEXT (see trainctl generate --help)");
    }
    gen.set_output_dir(gen_dir);
    gen.set_prompt(chat ? gen_chat : gen_prompt);
    gen.set_chat(chat);
    gen.set_max_new_tokens(gen_max_new);
    gen.set_temperature(gen_temperature);
    gen.set_top_k(gen_top_k);
    gen.set_top_p(gen_top_p);
    gen.set_seed(gen_seed);
    gen.set_tokenizer(gen_tokenizer);
    auto r = c.Generate(gen);
    if (!r.ok()) return Error(g, r.status());
    if (json) {
      PrintJson({{"prompt", r->prompt()},
                 {"text", r->text()},
                 {"prompt_ids", std::vector<int32_t>(r->prompt_ids().begin(), r->prompt_ids().end())},
                 {"ids", std::vector<int32_t>(r->ids().begin(), r->ids().end())},
                 {"finish_reason", r->finish_reason()},
                 {"device", r->device()},
                 {"seconds", r->seconds()}});
    } else {
      std::cout << r->text() << std::endl;
    }
    return 0;
  }
  if (*estimate) {
    auto r = c.EstimateFile(spec);
    if (!r.ok()) return Error(g, r.status());
    if (json) PrintJson(EstimateJson(*r));
    else std::cout << EstimateText(*r);
    if (EstimateFits(*r)) return 0;
    // The job does not fit: the plan and the advice are printed, and the exit code says so.
    std::fprintf(stderr, "trainctl: the job does not fit: needs %s, budget %s\n",
                 HumanBytes(r->plan().bytes().total()).c_str(), HumanBytes(r->plan().budget_bytes()).c_str());
    return 2;
  }
  return 2;
}
